"""Copies of the model that are rarely read back, kept in a file instead of in memory.

Rank 0 holds a few copies of a model it seldom reads: the weights the run started
from (what a NaN rollback before the first checkpoint goes back to) and the best
round's weights (what an early or NaN stop keeps). Kept in memory, each would
cost as much as the model; kept in an anonymous temporary file, each costs a write
when it changes and a read when it is wanted, and nothing while it waits.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import numpy as np

from mpi_trainer.persistence.checkpoint import StoredArray, StreamedArray

PART_VALUES = 1 << 22  # values read back at a time when the copy is streamed (16 MB of float32)


class SpilledArray:
    """A flat array held in an anonymous temporary file (gone when it is closed or the process ends)."""

    def __init__(self, values: np.ndarray | StoredArray) -> None:
        self.file = tempfile.TemporaryFile(prefix="mpi_trainer-")
        self.size, self.dtype = int(values.size), np.dtype(values.dtype)
        self.store(values)

    def store(self, values: np.ndarray | StoredArray) -> None:
        """Replace the copy by ``values`` (the same size), written straight from their buffer (a checkpoint's
        array left on disk: part by part)."""
        if values.size != self.size or values.dtype != self.dtype:
            raise ValueError(f"a spilled copy of {self.size} {self.dtype} values cannot take "
                             f"{values.size} {values.dtype} values")
        self.file.seek(0)
        for part in values.parts() if isinstance(values, StoredArray) else [values]:
            np.ascontiguousarray(part).tofile(self.file)
        self.file.flush()

    def read(self) -> np.ndarray:
        """The values, as a new array."""
        self.file.seek(0)
        return np.fromfile(self.file, dtype=self.dtype, count=self.size)

    def streamed(self) -> StreamedArray:
        """The values part by part (a checkpoint writes each as it is read): never whole in memory."""

        def deliver(take: Callable[[np.ndarray], None]) -> None:
            self.file.seek(0)
            for start in range(0, self.size, PART_VALUES):
                take(np.fromfile(self.file, dtype=self.dtype, count=min(PART_VALUES, self.size - start)))

        return StreamedArray(self.size, self.dtype, deliver)

    def close(self) -> None:
        self.file.close()
