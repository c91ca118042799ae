"""Which rows each worker trains on: one share of ``fit``'s input per worker, of the same kind.

Separation of concerns: Keras owns what an input *is* (its data adapters turn arrays, a
``tf.data.Dataset``, a ``keras.utils.PyDataset`` or a generator into batches, and refuse what
they cannot take); this module only cuts the input into shares, without changing a value:

* **arrays** (NumPy, tensors, pandas, any nesting of them, strings included): worker ``w`` of ``W``
  takes a fixed ``1/W`` of the rows, chosen by a seeded permutation when ``shuffle`` is on (so a
  file sorted by class is not split by class) and in order when it is off. Keras' own slicing
  (``array_slicing``) cuts them, as it cuts ``validation_split``;
* **a pipeline** (:func:`mpi_trainer.data.adapters.pipeline_share`, beside the adapter of its kind): a
  tf.data.Dataset's ``dataset.shard(W, w)``, every ``W``-th element; a PyDataset's every ``W``-th batch; a
  generator's every ``W``-th item; an input that deals itself (the command line's TFRecord files, a file
  read in batches) the share it builds for each worker (its files, its rows).

What kind an input is, :func:`~mpi_trainer.data.adapters.input_kind` alone says.

Every rank runs the same script and so holds the same input; the shares partition it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
