"""Dataset sources: built-in names and local files, split into train / validation / test.

Every rank runs the same loader with the same seed and obtains the same split,
so only block bounds (indices) travel over MPI.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpi_trainer.config import DataConfig
from mpi_trainer.errors import DataError

TABULAR_BUILTINS = {"iris": "load_iris", "wine": "load_wine", "breast_cancer": "load_breast_cancer"}
KERAS_BUILTINS = {
    "mnist": "mnist.npz",
    "fashion_mnist": "fashion-mnist",
    "cifar10": "cifar-10-batches-py",
}


@dataclass
class Dataset:
    """Features and integer class labels, split three ways."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])

    def describe(self) -> str:
        return (f"{self.name}: {len(self.x_train)} train / {len(self.x_val)} validation / "
                f"{len(self.x_test)} test samples, input {self.input_shape}, {self.num_classes} classes")


def keras_cache_dir() -> Path:
    return Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets"


def _as_features(x: np.ndarray, name: str) -> np.ndarray:
    """uint8 images are scaled to [0, 1]; 3-D image stacks gain a channel axis."""
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{name}: features must be numeric. Received dtype {x.dtype}")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    return x


def _as_labels(y: np.ndarray, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] > 1:
        y = y.argmax(axis=1)
    y = y.reshape(len(y), -1)[:, 0] if y.ndim > 1 else y
    if not np.issubdtype(y.dtype, np.integer):
        if np.issubdtype(y.dtype, np.floating) and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
            y = y.astype(np.int64)
        else:
            raise DataError(f"{name}: labels must be integer class indices. Received dtype {y.dtype}")
    if len(y) and y.min() < 0:
        raise DataError(f"{name}: labels must be >= 0. Received a label {int(y.min())}")
    return y.astype(np.int32)


def _check_pair(x: np.ndarray, y: np.ndarray, name: str, split: str) -> None:
    if len(x) != len(y):
        raise DataError(f"{name}: x_{split} and y_{split} differ in length. Received: "
                        f"{len(x)} feature rows, {len(y)} labels")
    if len(x) == 0:
        raise DataError(f"{name}: the {split} split is empty")
    if not np.all(np.isfinite(x)):
        raise DataError(f"{name}: x_{split} contains NaN or inf values; clean the data first")


def split_off(x: np.ndarray, y: np.ndarray, fraction: float, seed: int):
    """Seeded random split: returns (x_keep, y_keep, x_split, y_split)."""
    order = np.random.default_rng(seed).permutation(len(x))
    count = int(round(len(x) * fraction))
    if fraction > 0 and count == 0:
        count = 1
    taken, kept = order[:count], order[count:]
    return x[kept], y[kept], x[taken], y[taken]


def _load_npz(path: Path) -> tuple[np.ndarray, ...]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = set(archive.files)
            if {"x_train", "y_train", "x_test", "y_test"} <= names:
                return tuple(archive[k] for k in ("x_train", "y_train", "x_test", "y_test"))
            if {"x", "y"} <= names:
                return archive["x"], archive["y"]
    except (OSError, ValueError) as exc:
        raise DataError(f"Cannot read {str(path)!r} as .npz: {exc}") from None
    raise DataError(f"{str(path)!r} must hold arrays x_train, y_train, x_test, y_test or x, y. "
                    f"Received arrays: {sorted(names)}")


def _load_sklearn(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    if name == "digits":
        bunch = datasets.load_digits()
        return bunch.images.astype(np.float32) / 16.0, bunch.target
    return getattr(datasets, TABULAR_BUILTINS[name])(return_X_y=True)


def _load_keras(name: str) -> tuple[np.ndarray, ...]:
    import keras

    cached = keras_cache_dir() / KERAS_BUILTINS[name]
    if name == "mnist" and cached.is_file():
        return _load_npz(cached)
    try:
        (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, name).load_data()
    except Exception as exc:  # the loaders raise whatever the download layer raises
        raise DataError(
            f"Built-in dataset {name!r} is not available offline ({type(exc).__name__}). "
            f"Put Keras' copy at {cached} (the path Keras' loader caches it under), "
            f"or point data.source at a local .npz with x_train, y_train, x_test, y_test"
        ) from None
    return x_train, y_train, x_test, y_test


def _standardise(x_train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Scale tabular features with statistics of the training split only."""
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    std[std == 0] = 1.0
    return [(x - mean) / std for x in (x_train, *others)]


def load_dataset(cfg: DataConfig, seed: int) -> Dataset:
    """Load ``cfg.source`` and split it into train / validation / test."""
    name = cfg.source
    if cfg.is_file:
        path = Path(name).expanduser()
        if path.suffix.lower() != ".npz":
            raise DataError(f"data.source {name!r}: only .npz files are supported so far")
        arrays = _load_npz(path)
    elif name in KERAS_BUILTINS:
        arrays = _load_keras(name)
    else:
        arrays = _load_sklearn(name)
    tabular = name in TABULAR_BUILTINS
    if len(arrays) == 2:
        x, y = _as_features(arrays[0], name), _as_labels(arrays[1], name)
        _check_pair(x, y, name, "all")
        x_train, y_train, x_test, y_test = split_off(x, y, cfg.test_size, seed)
    else:
        x_train, x_test = (_as_features(a, name) for a in arrays[0::2])
        y_train, y_test = (_as_labels(a, name) for a in arrays[1::2])
    x_train, y_train, x_val, y_val = split_off(x_train, y_train, cfg.validation_size, seed + 1)
    if tabular:
        x_train, x_val, x_test = _standardise(x_train, x_val, x_test)
    for split, (xs, ys) in {"train": (x_train, y_train), "test": (x_test, y_test)}.items():
        _check_pair(xs, ys, name, split)
    num_classes = int(max(y_train.max(), y_test.max(), y_val.max() if len(y_val) else 0)) + 1
    return Dataset(name, x_train, y_train, x_val, y_val, x_test, y_test, max(num_classes, 2))
