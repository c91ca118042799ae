"""Which rows each worker trains on: one share of ``fit``'s input per worker, of the same kind.

Separation of concerns: Keras owns what an input *is* (its data adapters turn arrays, a
``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a generator into batches, and refuse what
they cannot take); this module only cuts the input into shares, without changing a value:

* **arrays** (NumPy, tensors, pandas, any nesting of them, strings included): worker ``w`` of ``W``
  takes a fixed ``1/W`` of the rows, chosen by a seeded permutation when ``shuffle`` is on (so a
  file sorted by class is not split by class) and in order when it is off. Keras' own slicing
  (``array_slicing``) cuts them, as it cuts ``validation_split``;
* **a tf.data.Dataset**: ``dataset.shard(W, w)``, every ``W``-th element;
* **a PyDataset**: every ``W``-th batch (``PyDatasetShare``);
* **a generator**: every ``W``-th item it yields;
* **an input that deals itself** (:class:`~mpi_trainer.data.adapters.DealtInput`: the command line's
  TFRecord files, a file read in batches): the share it builds for each worker (its files, its rows).

What kind an input is, :func:`~mpi_trainer.data.adapters.input_kind` alone says.

Every rank runs the same script and so holds the same input; the shares partition it.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from mpi_trainer.data.adapters import DealtInput, input_kind

SHARE_SEED = 1234  # the permutation that deals rows to workers (the same on every rank)


def row_count(arrays: Any) -> int:
    """Rows of a structure of arrays (the first non-None leaf's first axis)."""
    import keras

    for leaf in keras.tree.flatten(arrays):
        if leaf is not None:
            return int(leaf.shape[0]) if hasattr(leaf, "shape") else len(leaf)
    return 0


def dealing_order(rows: int, shuffle: Any) -> np.ndarray:
    """The order rows are dealt to workers in, each taking a contiguous part: seeded, or the rows' own."""
    return np.random.default_rng(SHARE_SEED).permutation(rows) if shuffle else np.arange(rows)


def share_rows(rows: int, workers: int, index: int, shuffle: Any) -> np.ndarray:
    """The rows of worker ``index`` (0-based) of ``workers``: a fixed, disjoint part of ``range(rows)``."""
    return np.sort(np.array_split(dealing_order(rows, shuffle), workers)[index])


def even_bounds(rows: int, workers: int) -> list[tuple[int, int]]:
    """Where each worker's part of the dealing order starts and ends, as :func:`share_rows` deals them."""
    from mpi_trainer.algorithms.rebalance import bounds_from_sizes

    return bounds_from_sizes([len(part) for part in np.array_split(np.arange(rows), workers)])


def take_rows(arrays: Any, rows: np.ndarray | list[int]) -> Any:
    """The given rows of every array in a structure (NumPy by indexing, others by Keras' own slicing)."""
    import keras
    from keras.src.trainers.data_adapters import array_slicing

    def take(leaf: Any) -> Any:
        if leaf is None or isinstance(leaf, np.ndarray):  # NumPy (strings included) stays NumPy
            return None if leaf is None else leaf[rows]
        return array_slicing.convert_to_sliceable(leaf)[rows]  # tensors, pandas, sparse: as Keras slices them

    return keras.tree.map_structure(take, arrays)


def array_share(data: tuple[Any, Any, Any], workers: int, index: int, shuffle: Any) -> tuple[Any, Any, Any]:
    """``(x, y, sample_weight)`` of one worker."""
    rows = share_rows(row_count(data), workers, index, shuffle)
    x, y, weights = data
    return tuple(None if part is None else take_rows(part, rows) for part in (x, y, weights))  # type: ignore


def pipeline_share(x: Any, workers: int, index: int) -> Any:
    """A dataset, PyDataset, generator or dealt input's share for worker ``index``."""
    kind = input_kind(x)
    if isinstance(x, DealtInput):
        return x.share(workers, index)
    if kind == "tf.data.Dataset":
        return x.shard(workers, index)
    if kind == "PyDataset":
        return PyDatasetShare(x, workers, index)
    return (item for item in itertools.islice(x, index, None, workers))  # a generator, as Keras takes one


def _py_dataset_class() -> Any:
    import keras

    return keras.utils.PyDataset


class PyDatasetShare(_py_dataset_class()):  # type: ignore[misc]
    """Every ``workers``-th batch of a PyDataset, from batch ``index``; its workers and queue settings kept."""

    def __init__(self, base: Any, workers: int, index: int) -> None:
        super().__init__(workers=base.workers, use_multiprocessing=base.use_multiprocessing,
                         max_queue_size=base.max_queue_size)
        self.base, self.stride, self.start = base, workers, index

    def __len__(self) -> int:
        return max(0, -(-(len(self.base) - self.start) // self.stride))

    def __getitem__(self, index: int) -> Any:
        return self.base[self.start + index * self.stride]

    def on_epoch_end(self) -> None:
        self.base.on_epoch_end()
