"""Arrays, in memory or on disk (an ``h5py`` dataset, a memory-mapped ``.npz`` member), read in chunks.

Arrays handed to :func:`mpi_trainer.fit` in memory take the row-reader path of
:mod:`mpi_trainer.data.sources` (a seeded shuffle cut into blocks; scatter and data increment work
there). This adapter is the streaming path: the training rows are a contiguous range of the arrays
and a worker's block is a contiguous range of those rows, read from disk one chunk of
``chunk_batches`` batches at a time. Each round visits the block's chunks in a new random order and
shuffles the rows inside each chunk, so the order is random at two levels while every read is a
contiguous slice (the fast way through HDF5). A worker holds one chunk of features and labels at a
time, whatever the file size; labels are read in slices like the features.

On TensorFlow the chunks enter a ``tf.data`` pipeline (Python runs once per chunk, the batches are
cut in TensorFlow, and the next batch is prefetched while one trains, as the in-memory feed of
:mod:`mpi_trainer.data.feed` does); elsewhere Keras reads the block as a ``PyDataset``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from mpi_trainer.data.adapters.base import BlockFeed, InputAdapter
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


class ChunkedBlock(keras.utils.PyDataset, BlockFeed):
    """Rows ``[start, end)`` of the training arrays, one shuffled chunk in memory at a time."""

    def __init__(self, adapter: ArrayAdapter, start: int, end: int) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        self.adapter, self.start, self.end = adapter, start, end
        self.units = end - start
        self.augmenter = None
        self.batch_size = 1
        self.limit: int | None = None
        self.chunks = np.zeros(1, dtype=np.int64)
        self.cached: tuple[int, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        steps = self.steps(self.batch_size)  # every chunk but the last holds whole batches
        return steps if self.limit is None else min(steps, self.limit)

    def chunk_rows(self, chunk: int) -> int:
        size = CHUNK_BATCHES * self.batch_size
        return min(size, self.end - self.start - chunk * size)

    def fit_input(self, batch_size: int, rng: np.random.Generator, max_steps: int | None) -> dict[str, Any]:
        self.shuffle_chunks(batch_size, rng, max_steps)
        if keras.backend.backend() == "tensorflow":
            return {"x": self.tf_dataset(max_steps), "shuffle": False}
        return {"x": self, "shuffle": False}

    def shuffle_chunks(self, batch_size: int, rng: np.random.Generator | None, max_steps: int | None) -> None:
        """The round's order of chunks (and, as each is read, of the rows inside it); without ``rng``, the
        rows' own order."""
        self.batch_size, self.limit, self.rng = batch_size, max_steps, rng
        chunks = math.ceil((self.end - self.start) / (CHUNK_BATCHES * batch_size))
        self.chunks = rng.permutation(chunks) if rng is not None else np.arange(chunks)
        steps = [math.ceil(self.chunk_rows(int(c)) / batch_size) for c in self.chunks]
        self.positions = np.concatenate([[0], np.cumsum(steps)])
        self.cached = None

    def chunk_stream(self) -> Any:
        """The round's chunks in their shuffled order, each shuffled inside and augmented."""
        from mpi_trainer.data.augmentation import augment

        for slot in range(len(self.chunks)):
            x, y = self.load(slot)
            yield augment(x, self.augmenter), y

    def tf_dataset(self, max_steps: int | None) -> Any:
        import tensorflow as tf

        x, y = self.adapter.first_batch()
        signature = (tf.TensorSpec((None, *x.shape[1:]), tf.as_dtype(x.dtype)),
                     tf.TensorSpec((None, *y.shape[1:]), tf.as_dtype(y.dtype)))
        size = self.batch_size
        dataset = tf.data.Dataset.from_generator(self.chunk_stream, output_signature=signature).flat_map(
            lambda a, b: tf.data.Dataset.from_tensor_slices((a, b)).batch(size))
        dataset = (dataset if max_steps is None else dataset.take(max_steps)).prefetch(1)
        options = tf.data.Options()
        options.autotune.enabled = False  # see mpi_trainer.data.feed: autotuning delays the end of a round
        return dataset.with_options(options)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        from mpi_trainer.data.augmentation import augment

        slot = int(np.searchsorted(self.positions, index, side="right")) - 1
        x, y = self.load(slot)
        first = int(index - self.positions[slot]) * self.batch_size
        return augment(x[first:first + self.batch_size], self.augmenter), y[first:first + self.batch_size]

    def load(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        if self.cached is None or self.cached[0] != slot:
            chunk = int(self.chunks[slot])
            begin = self.start + chunk * CHUNK_BATCHES * self.batch_size
            x, y = self.adapter.read_split(begin, begin + self.chunk_rows(chunk))
            order = self.rng.permutation(len(y)) if self.rng is not None else np.arange(len(y))
            self.cached = (slot, x[order], y[order])
        return self.cached[1], self.cached[2]

    def steps(self, batch_size: int) -> int:
        return math.ceil(self.units / batch_size)


class StreamedShare(ChunkedBlock):
    """A worker's rows ``[start, end)`` of a file read in batches, as the ``keras.utils.PyDataset`` its
    ``model.fit`` trains on: one shuffled chunk in memory at a time, the chunks in a new order each epoch
    (``seed`` None: in the rows' order)."""

    def __init__(self, adapter: ArrayAdapter, start: int, end: int, batch_size: int, seed: Any) -> None:
        super().__init__(adapter, start, end)
        self.shuffle_chunks(batch_size, None if seed is None else np.random.default_rng(seed), None)

    def on_epoch_end(self) -> None:
        self.shuffle_chunks(self.batch_size, self.rng, None)


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
    augments = True

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

    def block(self, start: int, end: int, worker: int, workers: int) -> BlockFeed:
        return ChunkedBlock(self, start, end)

    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        begin, stop = self.offset + start, self.offset + end
        x = read_features(self.features, begin, stop, self.name)
        return x, self.convert_labels(np.asarray(self.labels[begin:stop]))
