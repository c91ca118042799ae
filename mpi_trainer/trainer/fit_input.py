"""Fit's input on every rank: one home for what the trainer does with ``x``.

What kind an input is, :func:`mpi_trainer.data.adapters.input_kind` alone says; here the kind decides the rest:
Keras' own checks and splits (``validation_split``, its data adapter on each worker's share), the share each
worker trains on (:mod:`.shares` cuts it), the steps a share takes an epoch, the model built from the first
batch as ``fit`` builds it, and what a setting that deals out or counts rows cannot do with a kind of input
(:func:`check_input`, each refusal named with the input's kind).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.data.adapters import input_kind, pipeline_share
from mpi_trainer.data.adapters.refusals import input_refusals
from mpi_trainer.errors import ConfigError
from mpi_trainer.trainer import shares
from mpi_trainer.trainer.state import build_optimizers

if TYPE_CHECKING:
    from mpi_trainer.config import Config


@dataclass
class Prepared:
    """One rank's part of the fit, once Keras' checks passed."""

    share: dict[str, Any] = field(default_factory=dict)  # a worker's model.fit arguments
    rows: int | None = None  # a worker's rows (arrays)
    validation: dict[str, Any] | None = None  # rank 0's model.evaluate arguments; a worker's share when it scores
    workers_score: bool = False  # the workers score the validation data (evaluation.where = "workers")
    election: dict[str, Any] | None = None  # best-of: a worker's model.evaluate arguments for the validation data
    train_data: Any = None  # (x, y, sample_weight) after validation_split
    fixed_rows: Any = None  # a worker's rows of the training arrays (the data increment draws from the others)


def prepare(model: Any, kwargs: dict[str, Any], rank: int, workers: int, workers_score: bool = False,
            elects: bool = False) -> Prepared:
    """Keras' own checks and splits, then this rank's part: a worker's share, rank 0's validation data (a
    worker's share of it when ``workers_score`` and it can be shared, :func:`validation_shares`; all of it
    under best-of election, ``elects``, where every worker scores its own state on it)."""
    from keras.src.trainers.data_adapters import array_slicing, data_adapter_utils, get_data_adapter

    model._assert_compile_called("fit")
    x, y, weights = kwargs.get("x"), kwargs.get("y"), kwargs.get("sample_weight")
    validation = kwargs.get("validation_data")
    if kwargs.get("validation_split") and validation is None:
        (x, y, weights), validation = array_slicing.train_validation_split(
            (x, y, weights), validation_split=kwargs["validation_split"])
    prepared = Prepared(train_data=(x, y, weights))
    if input_kind(x) == "arrays":  # as Keras' adapter checks them, on every rank before any is cut
        data_adapter_utils.check_data_cardinality((x, y, weights))
    if validation is not None:
        val_x, val_y, val_weights = data_adapter_utils.unpack_x_y_sample_weight(validation)
        prepared.validation = {"x": val_x, "y": val_y, "sample_weight": val_weights,
                               "batch_size": kwargs.get("validation_batch_size") or kwargs.get("batch_size"),
                               "steps": kwargs.get("validation_steps")}
        prepared.workers_score = workers_score and not elects and validation_shares(prepared.validation, workers)
        if elects:
            prepared.election = prepared.validation if rank > 0 else None
        if rank > 0:
            prepared.validation = validation_share(prepared.validation, workers, rank - 1) \
                if prepared.workers_score else None
    if elects and validation is None:
        raise ConfigError("`aggregation.method = 'best'` keeps the worker state that scores best on the "
                          "validation data, and this fit has none. Received: aggregation.method='best' with "
                          "validation_data=None and validation_split="
                          f"{kwargs.get('validation_split')!r}; expected validation_data or validation_split, or "
                          "aggregation.method 'average' or 'weighted'")
    if rank == 0:
        return prepared
    steps = kwargs.get("steps_per_epoch")
    steps = None if steps is None else max(1, -(-int(steps) // workers))
    kind = input_kind(x)
    if kind == "arrays":
        rows = shares.row_count((x, y, weights))
        if rows < workers:
            raise ConfigError(f"Every worker needs rows to train on. Received: {rows} training rows for {workers} "
                              f"workers; expected at least one row per worker")
        index = shares.share_rows(rows, workers, rank - 1, kwargs.get("shuffle", True))
        x, y, weights = (None if part is None else shares.take_rows(part, index) for part in (x, y, weights))
        prepared.rows, prepared.fixed_rows = len(index), index
    else:
        x = pipeline_share(x, workers, rank - 1)
    share = {"x": x, "y": y, "sample_weight": weights, "batch_size": kwargs.get("batch_size"),
             "shuffle": kwargs.get("shuffle", True), "class_weight": kwargs.get("class_weight"),
             "steps_per_epoch": steps}
    if kind != "generator":  # a generator's first batch cannot be looked at and put back
        with warnings.catch_warnings():  # what Keras warns of here, it warns of again in the worker's own fit
            warnings.simplefilter("ignore", UserWarning)
            get_data_adapter(**{k: v for k, v in share.items() if k != "steps_per_epoch"}, steps_per_epoch=steps)
    prepared.share = share
    return prepared


def validation_shares(validation: dict[str, Any], workers: int) -> bool:
    """Whether the workers can score the validation data in shares: arrays of at least one row a worker,
    with no ``validation_steps`` (a pipeline, or a step count, is scored whole on rank 0)."""
    data = (validation["x"], validation["y"], validation["sample_weight"])
    return (validation["steps"] is None and input_kind(data[0]) == "arrays"
            and shares.row_count(data) >= workers)


def validation_share(validation: dict[str, Any], workers: int, index: int) -> dict[str, Any]:
    """Worker ``index``'s (0-based) rows of the validation arrays, as ``model.evaluate`` takes them."""
    data = (validation["x"], validation["y"], validation["sample_weight"])
    x, y, weights = shares.array_share(data, workers, index, shuffle=False)
    return {**validation, "x": x, "y": y, "sample_weight": weights}


def build(model: Any, kwargs: dict[str, Any], prepared: Prepared) -> None:
    """Build the model, its compiled metrics and its optimizer as ``fit``'s first batch would."""
    # Layers not built yet (a Sequential without keras.Input, a subclassed model's own layers): built from
    # the first batch. A model whose layers are all built but that has no call of its own (a GAN) is left.
    layers = list(model._flatten_layers(include_self=False))
    unbuilt = not all(layer.built for layer in layers) if layers else not model.built
    if unbuilt:
        x, y, weights = prepared.train_data
        if input_kind(x) == "generator":
            raise ConfigError("A model given with a generator must be built before `fit` (start it with "
                              "keras.Input, or call it on a batch). Received: an unbuilt model and a generator")
        model._symbolic_build(data_batch=first_batch(x, y, weights, kwargs.get("batch_size")))
    build_optimizers(model)  # every optimizer it holds, also those first built inside a custom train_step


def first_batch(x: Any, y: Any, weights: Any, batch_size: int | None) -> Any:
    """The first batch of the input, as the backend's ``fit`` would see it (for building)."""
    import keras
    from keras.src.trainers.data_adapters import get_data_adapter

    if input_kind(x) == "arrays":
        rows = list(range(min(batch_size or 32, shares.row_count((x, y, weights)))))
        x, y, weights = (None if part is None else shares.take_rows(part, rows) for part in (x, y, weights))
    adapter = get_data_adapter(x, y, weights, batch_size=batch_size, shuffle=False)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return next(iter(adapter.get_tf_dataset()))
    if backend == "jax":
        return next(iter(adapter.get_jax_iterator()))
    if backend == "torch":
        return next(iter(adapter.get_torch_dataloader()))
    return next(iter(adapter.get_numpy_iterator()))


def largest_share_steps(kwargs: dict[str, Any], prepared: Prepared, workers: int) -> int:
    """The batches of the largest worker's share of training arrays in an epoch (array_split's sizes)."""
    rows = -(-shares.row_count(prepared.train_data) // workers)
    return -(-rows // (kwargs.get("batch_size") or 32))


def rounds_an_epoch(sync_every: int, kwargs: dict[str, Any], prepared: Prepared, workers: int) -> int:
    """Rounds in an epoch: 1, or with ``train.sync_every = k`` enough rounds of k steps for the largest share."""
    if not sync_every:
        return 1
    return max(1, -(-largest_share_steps(kwargs, prepared, workers) // sync_every))


def full_steps(kwargs: dict[str, Any], prepared: Prepared, workers: int) -> list[int]:
    """Each worker's batches in a whole epoch (arrays dealt by ``np.array_split``, or steps_per_epoch shared)."""
    steps = kwargs.get("steps_per_epoch")
    if steps is not None:
        return [max(1, -(-int(steps) // workers))] * workers
    batch = kwargs.get("batch_size") or 32
    rows = shares.row_count(prepared.train_data)
    return [-(-len(part) // batch) for part in np.array_split(np.arange(rows), workers)]


def worker_steps(kwargs: dict[str, Any], prepared: Prepared, workers: int) -> int | None:
    """The batches each worker trains per epoch, as the progress bar counts them (None: not known)."""
    steps = kwargs.get("steps_per_epoch")
    if steps is not None:
        return max(1, -(-int(steps) // workers))
    data = prepared.train_data
    if input_kind(data[0]) != "arrays":
        return None
    rows = -(-shares.row_count(data) // workers)
    return max(1, -(-rows // (kwargs.get("batch_size") or 32)))


def describe_input(data: tuple[Any, Any, Any], workers: int, steps: int | None) -> str:
    """What trains, for the log: "1797 training rows (arrays), in 2 shares of 29 batches an epoch"."""
    kind = input_kind(data[0])
    what = f"{shares.row_count(data)} training rows (arrays)" if kind == "arrays" else f"a {kind}"
    return f"{what}, in {workers} shares" + ("" if steps is None else f" of {steps} batches an epoch")



def check_input(cfg: Config, kwargs: dict[str, Any]) -> None:
    """Every setting that deals out or counts a worker's rows, checked against the input it was given with
    (:func:`~mpi_trainer.data.adapters.refusals.input_refusals`), then the augmentation's images' shape."""
    from mpi_trainer.data.augmentation import check_image_input

    x = kwargs.get("x")
    refused = input_refusals(cfg, input_kind(x), kwargs.get("steps_per_epoch"), hasattr(x, "shape"))
    if refused:
        raise ConfigError(refused[0])
    if cfg.data.augmentation.enabled and x is not None:  # one array of images, or refused above
        check_image_input(cfg.data.augmentation, tuple(x.shape[1:]))
