"""A dataset whose training part stays in its input adapter, never read as whole arrays.

The training units (batches of a pipeline, rows of a file read in batches) are dealt to the workers by
the fit (a worker's contiguous rows of a file, every W-th batch of an image folder, its own TFRecord
files), each reading its share as it trains. The evaluation splits are the input's tail
(``data.test_size``, then ``data.validation_size``, of its units, as Keras' ``validation_split`` takes
the last samples) or ``validation_data``. A pipeline handed
to :func:`mpi_trainer.fit` follows ``model.fit``: its ``validation_data`` is the validation split
(``val_*``), and nothing is held out of the input unless the config asks for it. Files read in
batches keep them on disk and evaluation reads them a batch at a time; a pipeline's evaluation split
is read into memory once, at set-up, on the ranks that score.

What needs random access over the whole training set, or rows sent by the scheduler, is refused
before training by :func:`check_allows`, naming the input type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpi_trainer.config import Config
from mpi_trainer.data.adapters import InputAdapter
from mpi_trainer.data.sources import Dataset, _as_labels, is_class_labels
from mpi_trainer.errors import DataError


@dataclass
class StreamedTrain:
    """The training part: ``units`` of ``adapter``, whose first batch serves dry runs."""

    name: str
    adapter: InputAdapter
    units: int
    head: tuple[np.ndarray, np.ndarray]
    shards: list[int] | None = None  # each worker's own shard (dataset_fn), else equal blocks
    streams = True

    def __len__(self) -> int:
        return self.units

    @property
    def unit(self) -> str:
        return self.adapter.unit

    @property
    def labels(self) -> np.ndarray:
        return self.head[1][:0]

    @property
    def rows(self) -> np.ndarray:
        return np.empty(0, dtype=np.int64)

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Only the first batch's rows, for dry runs: the rest is read block by block."""
        positions = np.asarray(positions, dtype=np.int64)
        count = min(len(positions), len(self.head[1]))
        if not np.array_equal(positions[:count], np.arange(count)):
            raise RuntimeError(f"a {self.adapter.kind} is read block by block, not by row")
        return self.head[0][:count], self.head[1][:count]

    def block_bounds(self, workers: int) -> list[tuple[int, int]]:
        """Each worker's ``[start, end)`` of the training units (a ``dataset_fn``'s: its own shard's length);
        an input too short for every worker to get one is refused, naming it."""
        from mpi_trainer.data.partition import block_bounds

        if self.shards is None:
            if self.units < workers:
                raise DataError(f"{self.name}: every worker needs at least one of the {self.adapter.unit} of the "
                                f"{self.adapter.kind}. Received: {self.units} {self.adapter.unit} for {workers} "
                                f"workers")
            return block_bounds(self.units, workers)
        empty = [index + 1 for index, count in enumerate(self.shards) if count == 0]
        if empty:
            raise DataError(f"{self.name}: the shard dataset_fn built for worker {empty[0]} of {workers} is empty. "
                            f"Received: shard lengths {self.shards}; expected at least one batch per worker")
        ends = np.cumsum(self.shards)
        return [(int(end - count), int(end)) for end, count in zip(ends, self.shards)]


def streamed_train(dataset: Dataset) -> StreamedTrain | None:
    """The training part of ``dataset`` when it is read in blocks by an input adapter, else None."""
    return dataset.train if isinstance(dataset.train, StreamedTrain) else None


def _holdout(units: int, fraction: float) -> int:
    taken = int(round(units * fraction))
    return max(taken, 1) if fraction > 0 else 0


def _label_facts(y_parts: list[np.ndarray], name: str) -> tuple[int, bool]:
    """(number of outputs, whether the labels are class indices), from the labels at hand."""
    first = np.asarray(y_parts[0])
    if not is_class_labels(first):
        return (int(first.shape[-1]) if first.ndim > 1 else 1), False
    labels = [_as_labels(part, name) for part in y_parts if len(part)]
    return max(max(int(part.max()) for part in labels) + 1, 2), True


def _split_units(units: int, cfg: Config, has_test: bool) -> tuple[int, int, int]:
    """(train units, validation units, test units) cut from the input's end."""
    test = 0 if has_test else _holdout(units, cfg.data.test_size)
    val = _holdout(units - test, cfg.data.validation_size)
    return units - test - val, val, test


def _empty_like(head: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return head[0][:0], head[1][:0]


def _evaluation_units(adapter: InputAdapter, units: int, cfg: Config, given: bool) -> tuple[int, int, int]:
    """The split of a pipeline's units; an input without an end to hold out of needs ``validation_data``."""
    if adapter.can_hold_out() and adapter.shard_lengths(1) is None:
        return _split_units(units, cfg, given)
    if not given and cfg.data.test_size == 0 and cfg.data.validation_size == 0:
        return units, 0, 0  # nothing to score on, as model.fit without validation data
    if not given:
        raise DataError(f"A {adapter.kind} of this kind has no end to hold a test split out of. Received: "
                        f"validation_data=None; expected validation_data=(x, y), a dataset or a generator")
    if cfg.data.validation_size > 0:
        raise DataError(f"A {adapter.kind} of this kind has no end to hold a validation split out of. Received: "
                        f"data.validation_size={cfg.data.validation_size} (best-of election and val_* monitors "
                        f"need one); expected the data as a finite dataset or arrays")
    return units, 0, 0


def pipeline_dataset(name: str, adapter: InputAdapter, validation: Any, cfg: Config, workers: int,
                     read_val: bool = True, read_test: bool = True, keras_validation: bool = False) -> Dataset:
    """The dataset of a pipeline input: its training units stay in the pipeline; the evaluation splits the
    rank scores on (``read_val``, ``read_test``) are read into memory. ``keras_validation``: ``validation``
    is ``fit``'s ``validation_data``, scored as the validation split (``val_*``) as ``model.fit`` does."""
    from mpi_trainer.data.adapters import read_validation

    head = adapter.first_batch()
    shards = adapter.shard_lengths(workers)
    units = sum(shards) if shards is not None else adapter.length()
    if keras_validation and validation is not None:
        return _with_validation_data(name, adapter, validation, cfg, (units, shards, head), read_val, read_test)
    train, val, test = _evaluation_units(adapter, units, cfg, validation is not None)
    if train < 1:
        raise DataError(f"{name}: no {adapter.unit} are left to train on once the evaluation splits are held out. "
                        f"Received: {units} {adapter.unit}, data.test_size={cfg.data.test_size}, "
                        f"data.validation_size={cfg.data.validation_size}")
    x_val, y_val = adapter.read_split(train, train + val) if read_val and val else _empty_like(head)
    if not read_test:
        x_test, y_test = _empty_like(head)
    else:
        x_test, y_test = read_validation(validation) if validation is not None else adapter.read_split(train + val,
                                                                                                      units)
    return _assembled(StreamedTrain(name, adapter, train, head, shards), (x_val, y_val), (x_test, y_test))


def _with_validation_data(name: str, adapter: InputAdapter, validation: Any, cfg: Config, layout: tuple,
                          read_val: bool, read_test: bool) -> Dataset:
    """``fit(dataset, validation_data=...)``: the validation split is ``validation_data``; a test split is
    held out of the input's tail only when ``data.test_size`` asks for one (and the input has an end)."""
    from mpi_trainer.data.adapters import read_validation

    units, shards, head = layout
    test = _holdout(units, cfg.data.test_size) if adapter.can_hold_out() and shards is None else 0
    train = units - test
    if train < 1:
        raise DataError(f"{name}: no {adapter.unit} are left to train on once the test split is held out. "
                        f"Received: {units} {adapter.unit}, data.test_size={cfg.data.test_size}")
    x_val, y_val = read_validation(validation) if read_val else _empty_like(head)
    x_test, y_test = adapter.read_split(train, units) if read_test and test else _empty_like(head)
    return _assembled(StreamedTrain(name, adapter, train, head, shards), (x_val, y_val), (x_test, y_test))


def _assembled(train: StreamedTrain, val: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]) \
        -> Dataset:
    """The dataset, once the evaluation splits are read: label kind and count from every split at hand."""
    (x_val, y_val), (x_test, y_test), name, head = val, test, train.name, train.head
    num_outputs, classes = _label_facts([head[1], y_test, y_val], name)
    if classes:
        y_val, y_test = _as_labels(y_val, name), _as_labels(y_test, name)
    _check_same_shape(head, x_test, name)
    _check_same_shape(head, x_val, name)
    return Dataset(name, train, x_val, y_val, x_test, y_test, num_outputs, tuple(int(d) for d in head[0].shape[1:]),
                   classes=classes)


def _check_same_shape(head: tuple[np.ndarray, np.ndarray], x_test: np.ndarray, name: str) -> None:
    if len(x_test) and tuple(x_test.shape[1:]) != tuple(head[0].shape[1:]):
        raise DataError(f"{name}: the evaluation data's samples have shape {tuple(x_test.shape[1:])} but the "
                        f"training batches' have {tuple(head[0].shape[1:])}; they must match")


def _refusal(key: str, value: Any, why: str, kind: str, instead: str) -> str:
    return (f"`{key}` {why}, which a {kind} does not allow. Received: {key}={value!r} with the data as a {kind}; "
            f"expected {instead}")


def refusals(cfg: Config, adapter: InputAdapter) -> list[str]:
    """What the config asks that this source cannot give, one message each: what its kind of input refuses
    (:func:`~mpi_trainer.data.adapters.refusals.input_refusals`, as for a script's ``x``), and what a source
    read as a pipeline cannot do besides."""
    from mpi_trainer.data.adapters.refusals import input_refusals

    kind, out = adapter.kind, []
    if cfg.data.scatters:
        out.append(_refusal("data.placement", "scatter", "has rank 0 read the data and send it to every worker", kind,
                            "'shared': every rank reads the input itself"))
    if cfg.model.uses_lbfgs:
        out.append(_refusal("model.optimizer", "lbfgs", "holds each block in memory for full-batch gradients",
                            kind, "a Keras optimizer"))
    if not adapter.shared and (cfg.aggregation.elects or cfg.evaluation.on_workers):
        out.append(_refusal("aggregation.method" if cfg.aggregation.elects else "evaluation.where",
                            cfg.aggregation.method if cfg.aggregation.elects else cfg.evaluation.where,
                            "has the workers score shared evaluation data", kind,
                            "scoring on the scheduler ('average' or 'weighted', evaluation.where='scheduler')"))
    return out + input_refusals(cfg, kind, getattr(adapter, "steps", None), one_array=False)


def check_allows(cfg: Config, adapter: InputAdapter) -> None:
    refused = refusals(cfg, adapter)
    if refused:
        raise DataError(refused[0])
