"""A model and data named by the config, trained as a ``keras.Model``: the command line's ``train CONFIG``
and ``mpi_trainer.fit(build_fn | zoo name)`` without arrays.

Every rank reads the config's data source and builds and compiles the config's model itself (rank 0's
initial state reaches the others with the first epoch's order); then the fit is the one a script's
``keras.Model`` gets (:func:`~.fit.fit_model`), with the config's test split as the validation data
(``val_*`` in the History, ``test_*`` in rounds.csv) and the run directory the command line always keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.errors import InputError
from mpi_trainer.launch.agreement import agree, agreed

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport
    from mpi_trainer.config import Config

# full-batch L-BFGS's settings (model.optimizer = "lbfgs"), which the fit applies to a model the config compiles
LBFGS_KEYS = ("lbfgs.history_size", "lbfgs.gtol", "lbfgs.ftol", "lbfgs.max_evaluations", "lbfgs.batch_size")

# The keys this entry applies itself, before the fit: the model it builds and compiles, the data it reads.
APPLIED = frozenset({
    "model.name", "model.optimizer", "model.learning_rate", "model.activation", "model.loss", "model.metrics",
    "data.source", "data.test_size", "data.label", "data.features", "data.datasets", "data.image_size",
    "data.color_mode", "data.feature_shape", "data.feature_dtype", "data.stream", "data.validation_size",
    "data.placement", "train.shuffle", "train.seed", *LBFGS_KEYS,
})


def fit_config(transport: RankTransport, cfg: Config, config: Any, overrides: list[Any], run_dir: Any, resume: bool,
               builder: Any = None, callbacks: Sequence[Any] = (), config_path: str | Path | None = None,
               class_weight: Any = None) -> Any:
    """Every rank: the config's data and model, then the Keras fit; returns the History on every rank."""
    from mpi_trainer.launch.job import start_rank
    from mpi_trainer.launch.run_dir import chosen_path
    from mpi_trainer.launch.stream_choice import resolve_stream
    from mpi_trainer.trainer.fit import fit_model, scored_epochs

    start_rank(transport, cfg)  # placed before Keras starts: the model is built below
    cfg = resolve_stream(transport, cfg)  # data.stream = "auto": whether a worker's rows fit its memory
    agree(transport, "`--resume` needs the run directory to continue. Received: no --run-dir; expected --run-dir "
                     "DIR of an earlier run" if resume and not (run_dir or _launch_run_dir()) else None)
    dataset = model = error = None
    try:
        if transport.rank == 0 or not cfg.data.scatters:
            dataset = _dataset(cfg, transport.size - 1)
    except (InputError, ValueError, OSError) as exc:
        error = str(exc)
    agree(transport, error)
    if transport.rank == 0 and dataset is not None and dataset.class_names:
        from mpi_trainer.logs import get_logger

        get_logger().info("%s: string labels mapped to classes: %s", dataset.name, dataset.label_mapping())
    if cfg.data.scatters:
        dataset = _scattered(transport, dataset)
    try:  # a bug in the user's model function is not caught: it reaches the user with its traceback
        model = _model(cfg, agreed(dataset), builder)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    dataset, model = agreed(dataset), agreed(model)
    path = transport.bcast_object(str(chosen_path(run_dir, config_path)) if transport.rank == 0 else None)
    frequency = scored_epochs(cfg.evaluation.every, cfg.train.epochs)
    validation, callbacks = _validation(dataset, cfg.train.batch_size, list(callbacks) if transport.rank == 0 else [],
                                        transport.rank == 0)
    x, y, shuffle = _training_input(dataset, cfg, transport.size - 1)
    kwargs = {"x": x, "y": y, "batch_size": None if y is None else cfg.train.batch_size,
              "epochs": cfg.train.epochs, "verbose": 2, "shuffle": shuffle, "callbacks": callbacks,
              "class_weight": class_weight, "validation_data": validation, "validation_freq": frequency}
    describe = {"dataset": dataset.describe(), "model": cfg.model.name}
    history = fit_model(transport, model, kwargs, config, overrides, path, resume, applied=APPLIED,
                        describe=describe)
    if transport.rank == 0:
        print(f"run directory: {path}", flush=True)
    return history


def _validation(dataset: Any, batch_size: int, callbacks: list[Any], scheduler: bool) -> tuple[Any, list[Any]]:
    """The fit's validation data and rank 0's callbacks: the validation split, with the test split scored
    after each epoch the validation data is (``evaluation.every``) as ``test_*`` (first among the callbacks,
    so that every other one sees them); without a validation split, the test split is the validation data
    (``val_*``, and rounds.csv's ``test_*``)."""
    test = _evaluable(dataset.x_test, dataset.y_test, batch_size) if len(dataset.y_test) else None
    if not len(dataset.y_val):
        return test, callbacks
    scores = [_test_scores(test, batch_size)] if test and scheduler else []
    return _evaluable(dataset.x_val, dataset.y_val, batch_size), scores + callbacks


def _evaluable(x: Any, y: Any, batch_size: int) -> Any:
    """An evaluation split as Keras scores it: arrays as they are; rows a file is read in batches from
    (``data.stream``) as a ``keras.utils.PyDataset`` of their batches, read as it scores them."""
    if isinstance(x, np.ndarray):
        return x, y
    from mpi_trainer.data.adapters.arrays import SplitBatches

    return SplitBatches(x, y, batch_size)


def _training_input(dataset: Any, cfg: Config, workers: int) -> tuple[Any, Any, bool]:
    """``(x, y, shuffle)`` for the fit: the training arrays; or, for a source read as a pipeline, what each
    worker's share is cut from (:mod:`.shares`): an image folder's batches (Keras' own ``tf.data`` pipeline,
    every ``W``-th batch a worker's), TFRecord files (worker ``w`` reads files ``w, w + W, ...``) or a file
    read in batches (a contiguous range of its training rows a worker, read one shuffled chunk at a time)."""
    from mpi_trainer.data.adapters import DealtInput
    from mpi_trainer.data.adapters.arrays import ArrayAdapter, StreamedShare
    from mpi_trainer.data.adapters.tf_dataset import input_context
    from mpi_trainer.data.streamed import streamed_train

    streamed = streamed_train(dataset)
    if streamed is None:
        return dataset.x_train, dataset.y_train, cfg.train.shuffle
    adapter: Any = streamed.adapter  # a file's rows (ArrayAdapter), else an image folder's or TFRecords' tf.data
    units = streamed.units
    streamed.block_bounds(workers)  # every worker gets a unit of the input, or the input is refused
    if isinstance(adapter, ArrayAdapter):
        def rows(workers: int, index: int) -> Any:
            start, end = streamed.block_bounds(workers)[index]
            seed = (cfg.train.seed, index) if cfg.train.shuffle else None
            return StreamedShare(adapter, start, end, cfg.train.batch_size, seed)

        return DealtInput(adapter.kind, rows), None, False
    if adapter.dataset_fn is not None:
        return DealtInput(adapter.kind, lambda workers, index: adapter.dataset_fn(input_context(index, workers))), \
            None, False
    return adapter.dataset.take(units), None, False  # the batches before the validation split, if one is held out


def _test_scores(test: Any, batch_size: int) -> Any:
    """A Keras callback: rank 0 scores the test split after each epoch whose validation data was scored (its
    logs hold ``val_*``), adding ``test_<metric>`` to them."""
    import keras

    from mpi_trainer.trainer.round_protocol import reusable_input

    pair = isinstance(test, tuple)
    scoring = reusable_input({"x": test[0], "y": test[1], "batch_size": batch_size} if pair else {"x": test})

    class TestScores(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if logs is not None and any(name.startswith("val_") for name in logs):
                scores = self.model.evaluate(**scoring, verbose=0, return_dict=True)
                logs.update({f"test_{name}": float(value) for name, value in scores.items()})

    return TestScores()


def _launch_run_dir() -> str | None:
    import os

    from mpi_trainer.launch.run_dir import RUN_DIR_ENV

    return os.environ.get(RUN_DIR_ENV)


def _dataset(cfg: Config, workers: int) -> Any:
    """This rank's copy of the config's data: the training and test splits (a pipeline's training part stays
    in its pipeline)."""
    from mpi_trainer.data.pipelines import pipeline_source
    from mpi_trainer.data.sources import check_finite, load_dataset

    dataset = pipeline_source(cfg, workers)
    if dataset is None:  # rows read whole: a NaN among them fails every rank here, not the training
        dataset = load_dataset(cfg.data, cfg.train.seed)
        check_finite(np.asarray(dataset.x_train), dataset.name, "train")
    return dataset


def _scattered(transport: RankTransport, dataset: Any) -> Any:
    """``data.placement = "scatter"``: rank 0's copy of the data, sent to every worker (which reads no file).
    Each worker holds every row, so that its share can be cut again (``data.rebalance``, ``fault.survive``)."""
    if transport.rank == 0:
        from mpi_trainer.logs import get_logger

        get_logger().info("data.placement = scatter: rank 0 read %s and sends it to every worker", dataset.name)
    return transport.bcast_object(dataset if transport.rank == 0 else None)


def _model(cfg: Config, dataset: Any, builder: Any) -> Any:
    """The config's model for ``dataset``, compiled by the config, seeded by ``train.seed``."""
    import keras

    from mpi_trainer.models import build_model

    keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes, builder)
    return model


# The keys ``fit(build_fn, x, y)`` applies itself, before the fit: the model it builds and compiles.
BUILT_APPLIED = frozenset({"model.name", "model.optimizer", "model.learning_rate", "model.activation", "model.loss",
                           "model.metrics", "train.seed", *LBFGS_KEYS})


def fit_built(transport: RankTransport, cfg: Config, config: Any, overrides: list[Any], run_dir: Any, resume: bool,
              builder: Any, data: tuple[Any, Any, Any, Any], arguments: dict[str, Any],
              config_path: str | Path | None = None) -> Any:
    """``fit(build_fn | zoo name, x, y, ...)``: every rank builds and compiles the model for the shapes of
    the arrays (or of its pipeline's first batch), seeded by ``train.seed`` (rank 0's initial state reaches
    the others with the first epoch's order), then the fit a script's ``keras.Model`` gets, with the call's
    arguments as Keras reads them. Arrays given on rank 0 only (``None`` on the workers, or other arrays)
    are sent to every worker."""
    from mpi_trainer.data.adapters import is_pipeline
    from mpi_trainer.launch.job import start_rank
    from mpi_trainer.launch.run_dir import chosen_path
    from mpi_trainer.trainer.fit import fit_model

    start_rank(transport, cfg)  # placed before Keras starts: the model is built below
    x, y, weights, validation = data
    pipeline = is_pipeline(x)
    agree(transport, f"`x` and `y` go together. Received: x={type(x).__name__}, y=None"
          if x is not None and y is None and not pipeline else None)
    if not pipeline:
        x, y, weights, validation = _same_data(transport, (x, y, weights, validation))
    model = error = None
    try:
        first = (x, y)
        if pipeline:  # each rank builds its own pipeline: the model's shapes come from its first batch
            first, x = _first_batch(x, y, arguments.get("steps_per_epoch"))
        model = _built_model(cfg, builder, *first, validation)
    except (InputError, ValueError, TypeError) as exc:
        error = str(exc)
    agree(transport, error)
    path = transport.bcast_object(str(chosen_path(run_dir, config_path)) if transport.rank == 0 else None)
    kwargs = {**arguments, "x": x, "y": y, "sample_weight": weights, "validation_data": validation}
    history = fit_model(transport, agreed(model), kwargs, config, overrides, path, resume, applied=BUILT_APPLIED,
                        describe={"model": cfg.model.name})
    if transport.rank == 0:
        print(f"run directory: {path}", flush=True)
    return history


def _same_data(transport: RankTransport, data: tuple[Any, Any, Any, Any]) -> tuple[Any, Any, Any, Any]:
    """Every rank's data: its own when every rank passed the same arrays, else rank 0's, sent to each."""
    from mpi_trainer.trainer.run_record import data_print

    prints = transport.allgather(None if data[0] is None else data_print(data))
    agree(transport, "`x` and `y` are the training data, and rank 0 passed none. Received: x=None on rank 0; "
                     "expected the arrays on rank 0 (the workers may pass None)" if prints[0] is None else None)
    if all(print_ == prints[0] for print_ in prints):
        return data
    if transport.rank == 0:
        from mpi_trainer.logs import get_logger

        get_logger().info("the workers passed no arrays or others: rank 0's were sent to every worker")
    sent: tuple[Any, Any, Any, Any] = transport.bcast_object(data if transport.rank == 0 else None)
    return sent


def _first_batch(x: Any, y: Any, steps: Any) -> tuple[tuple[Any, Any], Any]:
    """A pipeline's first ``(x, y)`` batch, and the input to train on: the pipeline itself (a generator's
    first batch put back), or for a ``dataset_fn(context)`` the datasets it builds for each worker."""
    from mpi_trainer.data.adapters import DealtInput, get_input_adapter, is_dataset_fn
    from mpi_trainer.data.adapters.tf_dataset import input_context

    adapter: Any = get_input_adapter(x, y, steps)  # what Keras refuses with a pipeline, refused as Keras words it
    first = adapter.first_batch()
    if is_dataset_fn(x):
        return first, DealtInput("dataset_fn", lambda workers, index: x(input_context(index, workers)))
    return first, getattr(adapter, "iterator", x)  # a generator's batches, the peeked one first


def _built_model(cfg: Config, builder: Any, x: Any, y: Any, validation: Any = None) -> Any:
    """The model ``builder`` (or the zoo's ``model.name``) makes for these arrays (a pipeline's first batch),
    compiled by the config; the labels of ``validation`` arrays count among the classes."""
    import keras

    from mpi_trainer.data.sources import is_class_labels
    from mpi_trainer.models import build_model
    from mpi_trainer.models.dry_run import SAMPLES, dry_run

    labels = np.asarray(y)
    classes = is_class_labels(labels)
    seen = [labels] + ([np.asarray(validation[1])] if isinstance(validation, (tuple, list)) else [])
    outputs = max(max(int(part.max()) for part in seen if len(part)) + 1, 2) if classes and len(labels) else \
        (int(labels.shape[-1]) if labels.ndim > 1 else 1)
    keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg.model, tuple(np.shape(x)[1:]), outputs, classes, builder)
    dry_run(model, x[:SAMPLES], labels[:SAMPLES], train=False)  # the output, the labels and the loss meet
    return model
