"""``data.stream = true``: an HDF5 file or an uncompressed ``.npz`` read in batches, never whole.

Features and labels stay on disk (``h5py`` datasets, memory-mapped ``.npy`` members). The training
rows are ``x_train`` (Keras' layout) or the head of ``x``; the test split is ``x_test`` or the last
``data.test_size`` of ``x``, and a validation split, when one is needed, the last
``data.validation_size`` of the training rows, as Keras' ``validation_split`` takes the last samples.
A worker's block is a contiguous row range (see :class:`~mpi_trainer.data.adapters.arrays.ArrayAdapter`);
labels are checked in slices, and evaluation reads its splits a batch at a time.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.config import DataConfig
from mpi_trainer.data.adapters.arrays import ArrayAdapter, LazyRows
from mpi_trainer.data.readers import _names, _npz_memmap
from mpi_trainer.data.sources import Dataset, _as_labels, is_class_labels
from mpi_trainer.errors import DataError

LABEL_SLICE = 65536  # labels scanned this many at a time


def open_arrays(path: Path, cfg: DataConfig) -> list[Any]:
    """The file's arrays, lazily: ``[x, y]`` or ``[x_train, y_train, x_test, y_test]``."""
    if path.suffix.lower() == ".npz":
        return _open_npz(path, cfg)
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"Cannot open {str(path)!r} as HDF5: {exc}") from None
    available = {name for name, item in handle.items() if isinstance(item, h5py.Dataset)}
    return [handle[name] for name in _names(cfg.datasets, available, path, "datasets")]


def _open_npz(path: Path, cfg: DataConfig) -> list[Any]:
    try:
        with zipfile.ZipFile(path) as archive:
            members = {i.filename[:-4]: i for i in archive.infolist() if i.filename.endswith(".npy")}
        names = _names(cfg.datasets, set(members), path, "arrays")
        mapped = [_npz_memmap(path, members[name]) for name in names]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"Cannot read {str(path)!r} as .npz: {exc}") from None
    if any(array is None for array in mapped):
        raise DataError(f"`data.stream` reads an .npz from disk, which needs its arrays stored uncompressed. "
                        f"Received: data.source={str(path)!r} written compressed (or holding objects); expected "
                        f"a file written by np.savez, not np.savez_compressed")
    return mapped


def label_facts(labels: Any, rows: list[tuple[int, int]], name: str) -> tuple[int, bool]:
    """(number of outputs, class labels?) from the labels, read a slice at a time."""
    first = np.asarray(labels[0:1])
    if not is_class_labels(first if first.ndim > 1 else first.reshape(-1)):
        return (int(labels.shape[-1]) if len(labels.shape) > 1 else 1), False
    highest = -1
    for start, end in rows:
        for begin in range(start, end, LABEL_SLICE):
            part = _as_labels(np.asarray(labels[begin:min(end, begin + LABEL_SLICE)]), name)
            highest = max(highest, int(part.max()) if len(part) else -1)
    return max(highest + 1, 2), True


def _convert_labels(classes: bool, name: str) -> Callable[[np.ndarray], np.ndarray]:
    def convert(part: np.ndarray) -> np.ndarray:
        return _as_labels(part, name) if classes else np.asarray(part, dtype=np.float32)
    return convert


def _lengths(arrays: list[Any], name: str) -> None:
    for x, y in zip(arrays[::2], arrays[1::2]):
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{name}: features and labels differ in length. Received: {x.shape[0]} feature rows, "
                            f"{y.shape[0]} labels")


def _splits(arrays: list[Any], cfg: DataConfig) -> dict[str, tuple[Any, Any, int, int]]:
    """Each split as (features, labels, first row, end row)."""
    from mpi_trainer.data.streamed import _holdout

    x, y = arrays[0], arrays[1]
    rows = int(x.shape[0])
    if len(arrays) == 4:
        test = (arrays[2], arrays[3], 0, int(arrays[2].shape[0]))
        train_end = rows
    else:
        train_end = rows - _holdout(rows, cfg.test_size)
        test = (x, y, train_end, rows)
    val_start = train_end - _holdout(train_end, cfg.validation_size)
    return {"train": (x, y, 0, val_start), "val": (x, y, val_start, train_end), "test": test}


def _check_test_labels(test: tuple[Any, Any, int, int], num_outputs: int, classes: bool, name: str) -> None:
    """Test labels must be classes the training split has (read in slices, like the training labels)."""
    if not classes:
        return
    highest = label_facts(test[1], [test[2:]], name)[0] - 1
    if highest >= num_outputs:
        raise DataError(f"{name}: test label {highest} is out of range: the training split has classes "
                        f"0..{num_outputs - 1}; labels must be class indices seen in training")


def stream_dataset(cfg: DataConfig) -> Dataset:
    """The dataset of a file read in batches; nothing but one batch of rows is read here."""
    from mpi_trainer.data.sources import _as_features
    from mpi_trainer.data.streamed import StreamedTrain

    path = Path(cfg.source).expanduser()
    name = path.name
    arrays = open_arrays(path, cfg)
    _lengths(arrays, name)
    splits = _splits(arrays, cfg)
    for split in ("train", "test"):
        if splits[split][3] <= splits[split][2]:
            raise DataError(f"{name}: the {split} split is empty; check data.test_size, data.validation_size "
                            f"and the number of samples")
    num_outputs, classes = label_facts(arrays[1], [splits["train"][2:]], name)
    _check_test_labels(splits["test"], num_outputs, classes, name)
    convert = _convert_labels(classes, name)
    x, y, _, train_end = splits["train"]
    adapter = ArrayAdapter(x, y, 0, train_end, name, convert)
    head = adapter.first_batch()
    views = {split: (LazyRows(a, s, e, _as_features), LazyRows(b, s, e, convert))
             for split, (a, b, s, e) in splits.items() if split != "train"}
    return Dataset(name, StreamedTrain(name, adapter, train_end, head), *views["val"], *views["test"], num_outputs,
                   tuple(int(d) for d in head[0].shape[1:]), classes=classes)
