"""Targets of a multi-output model: ``y`` per output packed into one matrix whose rows move as one.

Blocks, shuffles, scatter and validation splits all move rows of one label array. ``fit(model, x,
{"digit": yd, "even": ye})`` (or ``y`` as a list in the model's output order, as Keras accepts it)
packs every output's targets side by side, in the model's output order, each flattened to float32
columns; a :class:`TargetColumn` remembers where each output's columns are, its per-sample shape
and its dtype, so that :mod:`mpi_trainer.models.packed_targets` cuts each output's targets back out
before Keras' own loss and metrics see them. The rows of every output are thus split exactly as
``x``'s are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mpi_trainer.errors import ConfigError


@dataclass(frozen=True)
class TargetColumn:
    """One output's place in the packed target matrix, its per-sample shape and its dtype."""

    name: str
    start: int
    end: int
    shape: tuple[int, ...]
    dtype: str

    def to_config(self) -> dict[str, Any]:
        return {**asdict(self), "shape": list(self.shape)}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TargetColumn:
        return cls(str(config["name"]), int(config["start"]), int(config["end"]),
                   tuple(int(d) for d in config["shape"]), str(config["dtype"]))


def is_structure(value: Any) -> bool:
    """A dict of arrays, or a list/tuple of arrays: one entry per output (a list of numbers is one array)."""
    if isinstance(value, Mapping):
        return True
    return isinstance(value, (list, tuple)) and bool(value) and all(hasattr(v, "shape") for v in value)


def describe(value: Any) -> str:
    """A structure as a message shows it: its kind and its keys or length."""
    if isinstance(value, Mapping):
        return f"{type(value).__name__} with keys {sorted(str(k) for k in value)}"
    return f"{type(value).__name__} of {len(value)} arrays"


def output_names(model: Any) -> list[str] | None:
    """The output names of a ``keras.Model`` in output order (None: not a built Keras model)."""
    names = getattr(model, "output_names", None)
    return None if names is None else [str(name) for name in names]


def by_output(y: Any, names: list[str], what: str) -> dict[str, np.ndarray]:
    """``y`` (a dict keyed by output names, or a list in output order) as ``{output name: array}``."""
    if isinstance(y, Mapping):
        given = sorted(str(key) for key in y)
        if given != sorted(names):
            raise ConfigError(f"`{what}` must be keyed by the model's output names. Received: {what} keys {given}; "
                              f"expected {sorted(names)}")
        return {name: np.asarray(y[name]) for name in names}
    if len(y) != len(names):
        raise ConfigError(f"`{what}` as a list must hold one array per model output, in output order. Received: "
                          f"{len(y)} arrays; expected {len(names)} for outputs {names}")
    return {name: np.asarray(value) for name, value in zip(names, y)}


def pack_targets(y: Any, names: list[str], what: str = "y") -> tuple[np.ndarray, list[TargetColumn]]:
    """Every output's targets as one float32 matrix (rows = samples), and where each output's columns are."""
    arrays = by_output(y, names, what)
    lengths = {name: len(array) if array.ndim else 0 for name, array in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ConfigError(f"`{what}`: every output's targets must have the same number of rows. "
                          f"Received: {lengths}; expected one row per sample of `x` for every output")
    columns, parts, start = [], [], 0
    for name in names:
        array = arrays[name]
        if not (np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)):
            raise ConfigError(f"`{what}[{name!r}]` must be numeric (encode strings as integers first). "
                              f"Received: dtype {array.dtype}")
        flat = array.reshape(len(array), -1).astype(np.float32)
        columns.append(TargetColumn(name, start, start + flat.shape[1], tuple(int(d) for d in array.shape[1:]),
                                    str(array.dtype)))
        parts.append(flat)
        start += flat.shape[1]
    return np.concatenate(parts, axis=1), columns


def unpack_targets(packed: np.ndarray, columns: list[TargetColumn]) -> dict[str, np.ndarray]:
    """The packed rows back as ``{output name: array}``, each with its shape and dtype."""
    return {c.name: packed[:, c.start:c.end].reshape(-1, *c.shape).astype(c.dtype) for c in columns}
