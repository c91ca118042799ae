"""A multi-input model fed from one matrix: dict inputs packed into columns, unpacked by the model.

Blocks, shuffles and scatter move rows of one array. ``fit(model, {"a": xa, "b": xb}, y)`` packs the
named inputs side by side (in sorted order of their names, so every rank packs alike) and trains a
wrapper whose first layers cut each input's columns back out and reshape them; the user's model is
nested inside it, so the wrapper's weights are the user model's, in the same order, and the files it
writes hold the user's model (:mod:`.nested`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from mpi_trainer.errors import ConfigError
from mpi_trainer.models.nested import NestedModel, Unpacking


@dataclass(frozen=True)
class Column:
    """One named input's place in the packed matrix and its per-sample shape."""

    name: str
    start: int
    end: int
    shape: tuple[int, ...]


def pack(inputs: Mapping[str, Any], what: str = "x") -> tuple[np.ndarray, list[Column]]:
    """The named arrays as one float32 matrix (rows = samples) and where each input's columns are."""
    arrays = {str(name): np.asarray(value) for name, value in inputs.items()}
    lengths = {len(a) for a in arrays.values()}
    if len(lengths) != 1:
        raise ConfigError(f"`{what}`: every input must have the same number of rows. Received: "
                          f"{ {name: len(a) for name, a in sorted(arrays.items())} }")
    columns, parts, start = [], [], 0
    for name in sorted(arrays):
        array = arrays[name]
        if not (np.issubdtype(array.dtype, np.number) or np.issubdtype(array.dtype, np.bool_)):
            raise ConfigError(f"`{what}[{name!r}]` must be numeric (encode strings as integers first). "
                              f"Received: dtype {array.dtype}")
        flat = array.reshape(len(array), -1).astype(np.float32)
        columns.append(Column(name, start, start + flat.shape[1], tuple(int(d) for d in array.shape[1:])))
        parts.append(flat)
        start += flat.shape[1]
    return np.concatenate(parts, axis=1), columns


@keras.saving.register_keras_serializable(package="mpi_trainer")
class InputColumns(Unpacking):
    """Columns ``[start, end)`` of the packed matrix, reshaped to one input's per-sample ``shape``."""

    def __init__(self, start: int, end: int, shape: tuple[int, ...], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start, self.end, self.shape = int(start), int(end), tuple(int(d) for d in shape)

    def call(self, packed: Any) -> Any:
        return keras.ops.reshape(packed[:, self.start:self.end], (-1, *self.shape))

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        return (input_shape[0], *self.shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "start": self.start, "end": self.end, "shape": list(self.shape)}


def packed_functional(model: Any, columns: list[Column]) -> Any:
    """``model`` (whose inputs are named as the packed columns) behind one packed input, as a functional model
    whose first layers cut each input's columns back out."""
    names = {column.name for column in columns}
    inputs = {tensor.name if hasattr(tensor, "name") else str(tensor) for tensor in model.inputs}
    expected = sorted(getattr(model, "input_names", None) or inputs)
    if names != set(expected):
        raise ConfigError(f"`x` names inputs the model does not have. Received: x keys {sorted(names)}; "
                          f"expected the model's inputs {expected}")
    packed = keras.Input((columns[-1].end,), name="packed_inputs")
    parts = {c.name: InputColumns(c.start, c.end, c.shape, name=f"columns_{c.name}")(packed) for c in columns}
    return keras.Model(packed, model(parts), name=f"{model.name}_packed")


def packed_model(model: Any, columns: list[Column]) -> Any:
    """:func:`packed_functional` as the model a job trains, compiled as ``model`` was; the files it writes
    hold ``model`` (:class:`~mpi_trainer.models.nested.NestedModel`)."""
    wrapper = NestedModel(packed_functional(model, columns), name=f"{model.name}_inputs")
    if getattr(model, "optimizer", None) is not None and getattr(model, "loss", None) is not None:
        wrapper.compile(optimizer=model.optimizer, loss=model.loss,
                        metrics=model.get_compile_config().get("metrics"))
    return wrapper


def packed_source(model: Any, layout: list[Column]) -> tuple[Any, list[tuple[str, Any]]]:
    """:func:`mpi_trainer.fit` with dict inputs: the builder of ``model`` behind one packed input, and the
    config override naming it."""
    if not isinstance(model, keras.Model):
        raise ConfigError(f"`x` as a dict of inputs needs `model` as a keras.Model whose inputs carry those names. "
                          f"Received: model of type {type(model).__name__}")
    return (lambda input_shape, num_outputs: packed_model(model, layout)), [("model.name", model.name)]
