"""What every input kind provides: its length in units, its first batch, and the rows of an evaluation
split held out at its end.

An adapter knows one kind of input (a ``tf.data.Dataset``, a ``keras.utils.PyDataset``, a generator, a
file read in batches): the config's sources read as pipelines are built from one
(:mod:`mpi_trainer.data.streamed`), and ``fit(build_fn, pipeline)`` takes the model's shapes from its
first batch. Which units each worker trains on is the fit's (:mod:`mpi_trainer.trainer.shares`).
Units are batches for pipelines (they come batched) and samples for files read in batches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from mpi_trainer.errors import DataError


class DealtInput:
    """An input that cuts itself into workers' shares (the command line's TFRecord files, a file read in
    batches, a ``dataset_fn``): ``share(workers, index)`` builds worker ``index``'s (0-based) as an input Keras'
    ``fit`` takes; ``kind`` names it in messages."""

    def __init__(self, kind: str, share: Any) -> None:
        self.kind, self.share = kind, share


class InputAdapter(ABC):
    """One kind of input read as a pipeline. ``kind`` names it in messages; ``unit`` is what its length counts."""

    kind: str = "input"
    unit: str = "batches"
    # every worker reads the same input and takes its block (False: each rank's own data)
    shared: bool = True

    @abstractmethod
    def length(self) -> int:
        """Units in the input, or the raise of a Keras-style message when it has no known length."""

    @abstractmethod
    def first_batch(self) -> tuple[np.ndarray, np.ndarray]:
        """The first ``(x, y)`` batch: the model's dry run and the element spec come from it."""

    @abstractmethod
    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Units ``[start, end)`` as arrays (an evaluation split held out at the input's end)."""

    def shard_lengths(self, workers: int) -> list[int] | None:
        """Units of each worker's own shard when the input cuts itself (``dataset_fn``); None otherwise."""
        return None

    def can_hold_out(self) -> bool:
        """Whether an evaluation split can be taken from the input's end (it has one)."""
        return True


def as_pair(element: Any, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A batch ``(x, y)`` as NumPy arrays; anything else is refused, naming the input kind."""
    if not isinstance(element, (tuple, list)) or len(element) != 2:
        got = f"a tuple of {len(element)}" if isinstance(element, (tuple, list)) else type(element).__name__
        raise DataError(f"A {kind} must yield batches `(x, y)` of features and labels. Received: {got}; "
                        f"sample weights and unlabelled batches are not supported")
    if _is_structure(element[1]):  # rows of one label array are what a block, a split and a feed move
        raise DataError(f"A {kind} must yield labels `y` as one array: targets per output (a dict or list) are "
                        f"supported with array inputs, `fit(model, x, {{output name: y}})`. Received: batches "
                        f"with y={_describe(element[1])}; expected (x, y) with y one array, or x and y as arrays")
    x, y = (np.asarray(part) for part in element)
    if len(x) != len(y):
        raise DataError(f"A {kind} yielded a batch whose features and labels differ in length. "
                        f"Received: x of {len(x)} rows, y of {len(y)}")
    return x, y


def concatenate(batches: Iterable[Any], kind: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """Batches of an evaluation split joined into arrays; an empty split is refused."""
    pairs = [as_pair(batch, kind) for batch in batches]
    if not pairs:
        raise DataError(f"The {what} taken from the {kind} is empty. Received: no batches; expected at least one "
                        f"(check its length, data.test_size and validation_data)")
    return np.concatenate([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


def check_steps(steps_per_epoch: int | None) -> int | None:
    if steps_per_epoch is None:
        return None
    if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, (int, np.integer)) or steps_per_epoch < 1:
        raise DataError(f"`steps_per_epoch` must be a positive integer (the batches of one round over all "
                        f"workers). Received: steps_per_epoch={steps_per_epoch!r}")
    return int(steps_per_epoch)


def _is_structure(value: Any) -> bool:
    """A dict of arrays, or a list/tuple of arrays: one entry per output (a list of numbers is one array)."""
    if isinstance(value, Mapping):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(hasattr(v, "shape") for v in value)


def _describe(value: Any) -> str:
    """A structure as a message shows it: its kind and its keys or length."""
    if isinstance(value, Mapping):
        return f"{type(value).__name__} with keys {sorted(str(k) for k in value)}"
    return f"{type(value).__name__} of {len(value)} arrays"
