"""Dataset sources split into train / validation / test by row indices.

Every rank reads the labels in full and derives the same split from the
seed, so only indices need to travel. Features are read by row: the
scheduler reads the validation and test rows it evaluates on, a worker reads
its block's rows (see :mod:`mpi_trainer.data.placement`), and nobody has to
hold the whole training set unless the source lives in memory anyway
(built-ins, CSV).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mpi_trainer.config import DataConfig
from mpi_trainer.config.schema import ARRAYS_SOURCE
from mpi_trainer.data.partition import shard
from mpi_trainer.data.readers import TABULAR_BUILTINS, RawArrays, read_file, read_npz, read_rows, read_sklearn
from mpi_trainer.errors import DataError

KERAS_BUILTINS = {
    "mnist": "mnist.npz",
    "fashion_mnist": "fashion-mnist",
    "cifar10": "cifar-10-batches-py",
}


def _as_features(x: np.ndarray, scale: bool = True) -> np.ndarray:
    """Features as float32; 3-D image stacks gain a channel axis. uint8 images from a file or a built-in
    are scaled to [0, 1]; ``scale=False`` (arrays given to ``fit``, used as given) keeps their values."""
    if scale and x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    return x


def feature_shape(x: Any) -> tuple[int, ...]:
    """The per-sample input shape that :func:`_as_features` will produce."""
    shape = tuple(int(d) for d in x.shape[1:])
    return (*shape, 1) if len(shape) == 2 else shape


def _check_feature_dtype(x: Any, name: str) -> None:
    if not (np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.bool_)):
        raise DataError(f"{name}: features must be numeric. Received dtype {x.dtype}")


def _as_labels(y: Any, name: str) -> np.ndarray:
    """Labels as given: integer class indices (one per sample) become int32; any other numeric
    target (floats, one-hot, multi-label, several columns) passes through as float32, shape kept."""
    labels = np.asarray(y)
    if is_class_labels(labels):
        labels = labels.reshape(len(labels))
        if len(labels) and labels.min() < 0:
            raise DataError(f"{name}: integer labels are class indices, so labels must be >= 0. "
                            f"Received a label {int(labels.min())}")
        return labels.astype(np.int32)
    if not (np.issubdtype(labels.dtype, np.number) or np.issubdtype(labels.dtype, np.bool_)):
        raise DataError(f"{name}: labels must be integer class indices or numeric targets. "
                        f"Received dtype {labels.dtype}")
    return labels.astype(np.float32)


def is_class_labels(y: np.ndarray) -> bool:
    """Integer (or boolean) labels, one per sample: class indices. Nothing else is taken for classes."""
    integral = np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_)
    return integral and (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1))


def check_finite(x: np.ndarray, name: str, split: str) -> None:
    if not np.all(np.isfinite(x)):
        raise DataError(f"{name}: x_{split} contains NaN or inf values; clean the data first")


def _check_lengths(x: Any, y: np.ndarray, name: str, split: str) -> None:
    if x.shape[0] != len(y):
        raise DataError(f"{name}: x_{split} and y_{split} differ in length. Received: "
                        f"{x.shape[0]} feature rows, {len(y)} labels")


def split_positions(count: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of ``range(count)``: returns (kept, taken), both in shuffled order."""
    order = np.random.default_rng(seed).permutation(count)
    taken = int(round(count * fraction))
    if fraction > 0 and taken == 0:
        taken = 1
    return order[taken:], order[:taken]


class RowArray(Protocol):
    """The rows of an evaluation split: an array, or rows read from disk as they are indexed
    (:class:`~mpi_trainer.data.adapters.arrays.LazyRows`, of a file read in batches)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> np.ndarray: ...


class TrainPart(Protocol):
    """The training split as a reader of rows by position: :class:`TrainRows`, or the training units of a
    streamed input (:class:`~mpi_trainer.data.streamed.StreamedTrain`, which reads only its first batch so)."""

    name: str

    @property
    def streams(self) -> bool:
        """Whether a worker's block is read as it trains (True) or held in memory as rows."""
        ...

    @property
    def unit(self) -> str:
        """What block bounds count: samples, or the batches of a pipeline."""
        ...

    @property
    def labels(self) -> np.ndarray: ...

    @property
    def rows(self) -> np.ndarray: ...

    def __len__(self) -> int: ...

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

@dataclass
class TrainRows:
    """The training split as a row reader: position ``p`` of the training set is source row ``rows[p]``."""

    name: str
    features: Any
    labels: np.ndarray
    rows: np.ndarray
    keep_open: list[Any] = field(default_factory=list)
    weights: np.ndarray | None = None  # a training weight per source row (``fit``'s ``sample_weight``)
    scale: bool = True  # uint8 features scaled to [0, 1] (not for arrays given to ``fit``)
    streams = False  # a worker holds its block's rows in memory
    unit = "samples"

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of the given training positions, checked for NaN and inf."""
        source_rows = self.rows[np.asarray(positions, dtype=np.int64)]
        x = _as_features(read_rows(self.features, source_rows), self.scale)
        check_finite(x, self.name, "train")
        return x, self.labels[source_rows]

@dataclass
class Dataset:
    """Features and labels split three ways; training features are read on demand.

    ``classes``: the labels are integer class indices and ``num_outputs`` is the
    number of classes; otherwise the labels are targets used as given and
    ``num_outputs`` is their width (the last axis; 1 for one value per sample).
    """

    name: str
    train: TrainPart
    x_val: RowArray
    y_val: RowArray
    x_test: RowArray
    y_test: RowArray
    num_outputs: int
    input_shape: tuple[int, ...]
    class_names: list[str] | None = None
    classes: bool = True
    # (index, count): the test arrays hold only part ``index`` of ``count`` of the test split
    test_part: tuple[int, int] | None = None
    _train_cache: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)

    @property
    def num_train(self) -> int:
        return len(self.train)

    def _all_train(self) -> tuple[np.ndarray, np.ndarray]:
        if self._train_cache is None:
            self._train_cache = self.train.read(np.arange(self.num_train))
        return self._train_cache

    @property
    def x_train(self) -> np.ndarray:
        """The whole training split in memory (read on first use)."""
        return self._all_train()[0]

    @property
    def y_train(self) -> np.ndarray:
        labels: np.ndarray = self.train.labels[self.train.rows]
        return labels

    def label_mapping(self) -> dict[str, int]:
        """String label -> class index, for sources whose labels were text."""
        return {label: index for index, label in enumerate(self.class_names or [])}

    def describe(self) -> str:
        return (f"{self.name}: {self.num_train} train / {len(self.y_val)} validation / "
                f"{len(self.y_test)} test samples, input {self.input_shape}, {self.describe_targets()}")

    def describe_targets(self) -> str:
        if self.classes:
            return f"{self.num_outputs} classes"
        return f"targets of shape {self.label_shape} ({self.train.labels.dtype})"

    @property
    def label_shape(self) -> tuple[int, ...]:
        """One sample's label shape: () for class indices and single values."""
        return tuple(int(d) for d in self.train.labels.shape[1:])


def keras_cache_dir() -> Path:
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets"


def _load_keras(name: str) -> RawArrays:
    import keras

    cached = keras_cache_dir() / KERAS_BUILTINS[name]
    if name == "mnist" and cached.is_file():
        return read_npz(cached)
    try:
        (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, name).load_data()
    except Exception as exc:  # the loaders raise whatever the download layer raises
        raise DataError(
            f"Built-in dataset {name!r} is not available offline ({type(exc).__name__}). "
            f"Put Keras' copy at {cached} (the path Keras' loader caches it under), "
            f"or point data.source at a local .npz with x_train, y_train, x_test, y_test"
        ) from None
    return RawArrays(x_train, y_train, x_test, y_test)


def read_source(cfg: DataConfig, arrays: RawArrays | None = None) -> RawArrays:
    if cfg.source == ARRAYS_SOURCE:
        if arrays is None:
            raise DataError(f"`data.source` = {ARRAYS_SOURCE!r} means the arrays passed to mpi_trainer.fit, and "
                            f"none were passed. Received: data.source={cfg.source!r}; expected a built-in "
                            f"dataset or a data file")
        # a copy: validation rebinds fields
        return RawArrays(arrays.x, arrays.y, arrays.x_test, arrays.y_test, x_val=arrays.x_val, y_val=arrays.y_val,
                         sample_weight=arrays.sample_weight)
    if cfg.is_file:
        return read_file(cfg)
    if cfg.source in KERAS_BUILTINS:
        return _load_keras(cfg.source)
    return read_sklearn(cfg.source)


@dataclass
class SplitRows:
    """Source rows of each split; ``test`` indexes ``x_test`` when the source has one, else ``x``."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray


def split_rows(raw: RawArrays, cfg: DataConfig, seed: int) -> SplitRows:
    if raw.y_test is None:  # no test rows given apart (their features come with them)
        pool, test = split_positions(len(raw.y), cfg.test_size, seed)
    else:
        pool, test = np.arange(len(raw.y)), np.arange(len(raw.y_test))
    if raw.y_val is not None:  # validation rows given apart: all of the pool trains
        return SplitRows(pool, np.arange(len(raw.y_val)), test)
    kept, taken = split_positions(len(pool), cfg.validation_size, seed + 1)
    return SplitRows(pool[kept], pool[taken], test)


def _standardise(raw: RawArrays, train_rows: np.ndarray) -> None:
    """Scale tabular features in place with statistics of the training split only."""
    x = np.asarray(raw.x, dtype=np.float64)
    mean, std = x[train_rows].mean(axis=0), x[train_rows].std(axis=0)
    std[std == 0] = 1.0
    raw.x = (x - mean) / std
    if raw.x_test is not None:
        raw.x_test = (np.asarray(raw.x_test, dtype=np.float64) - mean) / std


def _validate(raw: RawArrays, splits: SplitRows, name: str, test_wanted: bool = True) -> tuple[int, bool]:
    """Labels, lengths and empty splits; returns (the number of outputs, whether labels are classes).
    ``test_wanted``: an empty test split is an error (False: ``data.test_size = 0`` holds none out)."""
    _check_feature_dtype(raw.x, name)
    raw.y = _as_labels(raw.y, name)
    _check_lengths(raw.x, raw.y, name, "train" if raw.x_test is not None else "all")
    held_out = [("val", splits.val, raw.y), ("test", splits.test, raw.y)]  # split from x unless given apart
    for split in ("test", "val"):
        if getattr(raw, f"x_{split}") is not None:
            labels = _as_labels(getattr(raw, f"y_{split}"), name)
            setattr(raw, f"y_{split}", labels)
            _check_lengths(getattr(raw, f"x_{split}"), labels, name, split)
            _check_same_rows(raw, name, split)
            held_out = [entry for entry in held_out if entry[0] != split] + [(split, getattr(splits, split), labels)]
    for split in ("train", "test") if test_wanted or raw.x_test is not None else ("train",):
        if len(getattr(splits, split)) == 0:
            raise DataError(f"{name}: the {split} split is empty; check data.test_size, "
                            f"data.validation_size and the number of samples")
    if raw.y.dtype != np.int32:
        return (int(raw.y.shape[-1]) if raw.y.ndim > 1 else 1), False
    train_classes = int(raw.y[splits.train].max()) + 1
    for split, rows, labels in held_out:
        highest = int(labels[rows].max()) if len(rows) else -1
        if highest >= train_classes:
            what = "validation" if split == "val" else split
            raise DataError(f"{name}: {what} label {highest} is out of range: the training split has classes "
                            f"0..{train_classes - 1}; labels must be class indices seen in training")
    return max(train_classes, 2), True


def _check_same_rows(raw: RawArrays, name: str, split: str = "test") -> None:
    """Train and held-out (test or validation) rows must have the same feature shape and kind of label."""
    x_held, y_held = getattr(raw, f"x_{split}"), getattr(raw, f"y_{split}")
    if tuple(x_held.shape[1:]) != tuple(raw.x.shape[1:]):
        raise DataError(f"{name}: x_{split} rows have shape {tuple(x_held.shape[1:])} but x_train "
                        f"rows have shape {tuple(raw.x.shape[1:])}; they must match")
    if y_held.dtype != raw.y.dtype or y_held.shape[1:] != raw.y.shape[1:]:
        raise DataError(f"{name}: y_{split} holds labels of shape {y_held.shape[1:]} and dtype "
                        f"{y_held.dtype} but y_train of shape {raw.y.shape[1:]} and dtype {raw.y.dtype}; "
                        f"they must match")


def _chosen(rows: np.ndarray, read: bool | tuple[int, int]) -> np.ndarray:
    """All of a split's rows, none, or part ``index`` of ``count`` (``read = (index, count)``)."""
    if isinstance(read, tuple):
        return rows[shard(len(rows), *read)]
    return rows if read else rows[:0]


def load_dataset(cfg: DataConfig, seed: int, read_val: bool = True, read_test: bool | tuple[int, int] = True,
                 arrays: RawArrays | None = None) -> Dataset:
    """Open ``cfg.source`` (or take ``arrays``, from :func:`mpi_trainer.fit`), split it, and read the
    validation and test features.

    A worker passes ``read_test=False`` (it never evaluates on the test split), or under
    ``evaluation.where = "workers"`` the part of the test split it scores, ``(worker index, workers)``, and
    ``read_val=False`` unless it scores candidates for best-of election or validation shards.
    """
    name = Path(cfg.source).name if cfg.is_file else cfg.source
    raw = read_source(cfg, arrays)
    splits = split_rows(raw, cfg, seed)
    num_outputs, classes = _validate(raw, splits, name, test_wanted=cfg.test_size > 0)
    if raw.tabular or cfg.source in TABULAR_BUILTINS:
        _standardise(raw, splits.train)
    x_test_source = raw.x if raw.x_test is None else raw.x_test
    y_test_source = raw.y if raw.y_test is None else raw.y_test
    val_rows = splits.val if read_val else splits.val[:0]
    test_rows = _chosen(splits.test, read_test)
    x_val_source, y_val_source = (raw.x, raw.y) if raw.x_val is None or raw.y_val is None else (raw.x_val, raw.y_val)
    scale = cfg.source != ARRAYS_SOURCE  # arrays given to fit keep their values
    x_val = _as_features(read_rows(x_val_source, val_rows), scale)
    x_test = _as_features(read_rows(x_test_source, test_rows), scale)
    check_finite(x_val, name, "validation")
    check_finite(x_test, name, "test")
    weights = None if raw.sample_weight is None else np.asarray(raw.sample_weight, dtype=np.float32)
    train = TrainRows(name, raw.x, raw.y, splits.train, raw.keep_open, weights, scale)
    return Dataset(name, train, x_val, y_val_source[val_rows], x_test, y_test_source[test_rows], num_outputs,
                   feature_shape(raw.x), raw.class_names, classes,
                   test_part=read_test if isinstance(read_test, tuple) else None)


