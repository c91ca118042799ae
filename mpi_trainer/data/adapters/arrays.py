"""Arrays, in memory or on disk (an ``h5py`` dataset, a memory-mapped ``.npz`` member), read in chunks.

A file too large for memory (``data.stream``) is read in batches: the training rows are a contiguous
range of the arrays and a worker's share is a contiguous range of those rows
(:class:`StreamedShare`), read from disk one chunk of ``CHUNK_BATCHES`` batches at a time. Each epoch
visits the share's chunks in a new random order and shuffles the rows inside each chunk, so the order
is random at two levels while every read is a contiguous slice (the fast way through HDF5). A worker
holds one chunk of features and labels at a time, whatever the file size; labels are read in slices
like the features.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from mpi_trainer.data.adapters.base import InputAdapter
from mpi_trainer.errors import DataError

KIND = "file read in batches (data.stream)"
CHUNK_BATCHES = 32  # batches per contiguous read: ~0.4 MB of MNIST rows at batch 128


def read_features(features: Any, start: int, end: int, name: str) -> np.ndarray:
    from mpi_trainer.data.sources import _as_features, check_finite

    x = _as_features(np.asarray(features[start:end]))
    check_finite(x, name, f"train rows {start}..{end - 1}")
    return x


class LazyRows:
    """Rows ``[start, end)`` of an on-disk array, converted as they are read: evaluation slices it
    ``batch`` rows at a time (``summed_metric_state``), so it streams too."""

    def __init__(self, array: Any, start: int, end: int, convert: Callable[[np.ndarray], np.ndarray]) -> None:
        self.array, self.start, self.end, self.convert = array, start, end, convert
        first = convert(np.asarray(array[start:start + 1])) if end > start else None
        self.shape = (end - start, *(first.shape[1:] if first is not None else array.shape[1:]))
        self.dtype = first.dtype if first is not None else np.dtype(np.float32)

    def __len__(self) -> int:
        return self.end - self.start

    def __getitem__(self, index: Any) -> np.ndarray:
        if isinstance(index, slice):
            begin, stop, step = index.indices(len(self))
            if step == 1:
                return self.convert(np.asarray(self.array[self.start + begin:self.start + max(begin, stop)]))
        from mpi_trainer.data.readers import read_rows

        rows = np.arange(len(self))[index] + self.start
        return self.convert(read_rows(self.array, np.atleast_1d(rows)))


class StreamedShare(keras.utils.PyDataset):
    """A worker's rows ``[start, end)`` of a file read in batches, as the ``keras.utils.PyDataset`` its
    ``model.fit`` trains on: one shuffled chunk in memory at a time, the chunks in a new order each epoch
    and the rows shuffled inside each as it is read (``seed`` None: in the rows' order)."""

    def __init__(self, adapter: ArrayAdapter, start: int, end: int, batch_size: int, seed: Any) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self.adapter, self.start, self.end, self.batch_size = adapter, start, end, batch_size
        self.rng = None if seed is None else np.random.default_rng(seed)
        self.cached: tuple[int, np.ndarray, np.ndarray] | None = None
        self.shuffle_chunks()

    def __len__(self) -> int:
        return math.ceil((self.end - self.start) / self.batch_size)  # every chunk but the last holds whole batches

    def on_epoch_end(self) -> None:
        self.shuffle_chunks()

    def chunk_rows(self, chunk: int) -> int:
        size = CHUNK_BATCHES * self.batch_size
        return min(size, self.end - self.start - chunk * size)

    def shuffle_chunks(self) -> None:
        """The epoch's order of chunks (and, as each is read, of the rows inside it)."""
        chunks = math.ceil((self.end - self.start) / (CHUNK_BATCHES * self.batch_size))
        self.chunks = self.rng.permutation(chunks) if self.rng is not None else np.arange(chunks)
        steps = [math.ceil(self.chunk_rows(int(c)) / self.batch_size) for c in self.chunks]
        self.positions = np.concatenate([[0], np.cumsum(steps)])
        self.cached = None

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        slot = int(np.searchsorted(self.positions, index, side="right")) - 1
        x, y = self.load(slot)
        first = int(index - self.positions[slot]) * self.batch_size
        return x[first:first + self.batch_size], y[first:first + self.batch_size]

    def load(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        if self.cached is None or self.cached[0] != slot:
            chunk = int(self.chunks[slot])
            begin = self.start + chunk * CHUNK_BATCHES * self.batch_size
            x, y = self.adapter.read_split(begin, begin + self.chunk_rows(chunk))
            order = self.rng.permutation(len(y)) if self.rng is not None else np.arange(len(y))
            self.cached = (slot, x[order], y[order])
        return self.cached[1], self.cached[2]


class SplitBatches(keras.utils.PyDataset):
    """An evaluation split read from disk (``LazyRows`` of features and labels), batch by batch, as
    ``model.evaluate`` takes it."""

    def __init__(self, x: Any, y: Any, batch_size: int) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.y) / self.batch_size)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return np.asarray(self.x[rows]), np.asarray(self.y[rows])


class ArrayAdapter(InputAdapter):
    """Rows ``[offset, offset + count)`` of ``features`` and ``labels`` (arrays or on-disk datasets)."""

    kind = KIND
    unit = "samples"

    def __init__(self, features: Any, labels: Any, offset: int, count: int, name: str,
                 convert_labels: Callable[[np.ndarray], np.ndarray]) -> None:
        self.features, self.labels, self.offset, self.count = features, labels, offset, count
        self.name, self.convert_labels = name, convert_labels

    def length(self) -> int:
        if self.count == 0:
            raise DataError(f"{self.name}: the train split is empty. Received: 0 training rows")
        return self.count

    def first_batch(self) -> tuple[np.ndarray, np.ndarray]:
        return self.read_split(0, min(self.count, 64))

    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        begin, stop = self.offset + start, self.offset + end
        x = read_features(self.features, begin, stop, self.name)
        return x, self.convert_labels(np.asarray(self.labels[begin:stop]))
