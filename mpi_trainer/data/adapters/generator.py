"""A generator (or any iterator) of ``(x, y)`` batches: one rank's own data.

A generator cannot be rewound, cut or shared between processes, so, as in Horovod, each rank's
generator is that rank's own data: each worker trains on the batches its own generator yields, and
is expected to yield its own part of the data (or an endless random stream). ``steps_per_epoch``
is required: the batches one epoch reads over all workers, shared out between them. An epoch goes on
where the previous one stopped. The scheduler trains on nothing; it reads its
generator's first batch for the model's dry run and scores on ``validation_data``, which is
required (a generator has no end to hold a split out of).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from mpi_trainer.data.adapters.base import InputAdapter, as_pair, concatenate
from mpi_trainer.errors import DataError

KIND = "generator"


class GeneratorAdapter(InputAdapter):
    kind = KIND
    shared = False

    def __init__(self, iterator: Iterator[Any], steps_per_epoch: int | None) -> None:
        if steps_per_epoch is None:
            raise DataError("A generator has no length, so a round needs to know how many batches it reads. "
                            "Received: steps_per_epoch=None; expected steps_per_epoch=N (the batches one round "
                            "reads over all workers)")
        self.iterator, self.steps = iterator, steps_per_epoch
        self.peeked: tuple[np.ndarray, np.ndarray] | None = None

    def length(self) -> int:
        return self.steps

    def can_hold_out(self) -> bool:
        return False

    def first_batch(self) -> tuple[np.ndarray, np.ndarray]:
        if self.peeked is None:
            try:
                self.peeked = as_pair(next(self.iterator), self.kind)
            except StopIteration:
                raise DataError("The generator is empty. Received: no batches; expected at least one") from None
            self.iterator = itertools.chain([self.peeked], self.iterator)  # the peeked batch is trained on
        return self.peeked

    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        raise DataError("A generator has no end to hold an evaluation split out of. Received: "
                        "validation_data=None; expected validation_data=(x, y), a dataset or a generator")


def read_all(iterator: Iterator[Any], what: str) -> tuple[np.ndarray, np.ndarray]:
    """A finite generator given as ``validation_data``, read once."""
    return concatenate(iterator, KIND, what)
