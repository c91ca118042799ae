"""A ``keras.utils.PyDataset`` as a source read as a pipeline: its length, first batch and held-out splits.

Every rank builds the same ``PyDataset``; worker *i* of *W* trains on every *W*-th batch of it, from batch
*i*, in the dataset's own order (:class:`PyDatasetShare`; Keras ignores
``shuffle`` for a ``PyDataset`` too: shuffling is the dataset's business, e.g. in ``on_epoch_end``). Its ``workers``,
``use_multiprocessing`` and ``max_queue_size`` carry over to the block. A ``PyDataset`` is read on
every backend. Its length (``__len__`` or ``num_batches``) is required: it is what the blocks cut.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_trainer.data.adapters.base import InputAdapter, as_pair, concatenate
from mpi_trainer.errors import DataError

KIND = "keras.utils.PyDataset"


def batch_count(dataset: Any) -> int:
    try:
        count = dataset.num_batches
    except (NotImplementedError, TypeError):
        count = None
    if count is None:
        raise DataError(f"A {KIND} must define `__len__` (or `num_batches`), the number of batches, so that it "
                        f"can be cut into blocks. Received: {type(dataset).__name__} without a length")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise DataError(f"A {KIND}'s `__len__` must return a number of batches >= 0. Received: "
                        f"len({type(dataset).__name__})={count!r}")
    return int(count)


class PyDatasetAdapter(InputAdapter):
    kind = KIND

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.count = batch_count(dataset)

    def length(self) -> int:
        return self.count

    def first_batch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.count == 0:
            raise DataError(f"The {KIND} is empty. Received: len={self.count}; expected at least one batch")
        return as_pair(self.dataset[0], self.kind)

    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return concatenate((self.dataset[index] for index in range(start, end)), self.kind, "evaluation split")


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
