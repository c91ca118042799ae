"""Keras weight lists <-> one contiguous float32 buffer, the unit that travels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class WeightCodec:
    """Packs a list of arrays with fixed shapes into one flat float32 vector."""

    def __init__(self, shapes: Sequence[tuple[int, ...]]) -> None:
        self.shapes = [tuple(int(d) for d in shape) for shape in shapes]
        self.sizes = [int(np.prod(shape, dtype=np.int64)) for shape in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes, dtype=np.int64)])
        self.size = int(self.offsets[-1])

    @classmethod
    def from_weights(cls, weights: Sequence[np.ndarray]) -> WeightCodec:
        return cls([np.shape(w) for w in weights])

    @property
    def nbytes(self) -> int:
        return self.size * 4

    def empty(self) -> np.ndarray:
        return np.zeros(self.size, dtype=np.float32)

    def flatten(self, weights: Sequence[Any], out: np.ndarray | None = None) -> np.ndarray:
        """``weights`` in one vector (``out`` when given). They may be a model's variables (``model.weights``,
        in ``get_weights()``'s order): each is copied to the host in turn, so the full list of host copies
        that ``get_weights()`` makes never exists beside ``out``."""
        if len(weights) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} weight arrays, received {len(weights)}")
        out = self.empty() if out is None else out
        for array, shape, start, stop in zip(weights, self.shapes, self.offsets[:-1], self.offsets[1:]):
            if tuple(np.shape(array)) != shape:
                raise ValueError(f"weight shape mismatch: expected {shape}, received {np.shape(array)}")
            out[start:stop] = np.ravel(array)
        return out

    def spans(self, flags: Sequence[bool]) -> list[tuple[int, int]]:
        """The ``(start, stop)`` spans of the flat vector that hold the arrays flagged True, adjacent
        ones joined."""
        if len(flags) != len(self.shapes):
            raise ValueError(f"expected one flag per weight array ({len(self.shapes)}), received {len(flags)}")
        spans: list[tuple[int, int]] = []
        for flag, start, stop in zip(flags, self.offsets[:-1].tolist(), self.offsets[1:].tolist()):
            if not flag or stop == start:
                continue
            if spans and spans[-1][1] == start:
                spans[-1] = (spans[-1][0], stop)
            else:
                spans.append((start, stop))
        return spans

    def trainable_spans(self, model: Any) -> list[tuple[int, int]]:
        """The spans of ``model``'s trainable floating-point weights (``model.weights`` lists its variables in
        the order of ``model.get_weights()``, each with ``.trainable`` and ``.dtype``)."""
        variables = list(getattr(model, "weights", None) or [])
        if not variables:  # not a Keras model: every weight is a parameter
            return self.spans([True] * len(self.shapes))
        if len(variables) != len(self.shapes):
            raise ValueError(f"the model lists {len(variables)} variables for {len(self.shapes)} weight arrays")
        return self.spans([bool(getattr(v, "trainable", True)) and "float" in str(getattr(v, "dtype", "float32"))
                           for v in variables])

    def load(self, model: Any, flat: np.ndarray) -> None:
        """``model.set_weights(self.unflatten(flat))``, with half the temporary memory on TensorFlow.

        Keras' ``assign`` converts each array to a tensor before TensorFlow copies it into the variable,
        which briefly holds two copies of the variable: for a model whose weights sit in a few very large
        layers, most of the peak memory of a round. On TensorFlow a float32 variable of the same shape is
        written by TensorFlow's own assign op straight from its view of ``flat`` (one temporary copy); any
        other variable, and every variable on another backend, goes through Keras.
        """
        import keras

        arrays = self.unflatten(flat)
        variables = list(model.weights)
        if keras.backend.backend() != "tensorflow" or len(variables) != len(arrays):
            model.set_weights(arrays)  # Keras' own check names a mismatch
            return
        import tensorflow as tf

        for variable, array in zip(variables, arrays):
            if str(variable.dtype) == "float32" and tuple(variable.shape) == array.shape:
                # a copy: TensorFlow may keep an aligned NumPy buffer as the variable's own, and ``flat`` is
                # written again by the next round
                tf.raw_ops.AssignVariableOp(resource=variable.handle, value=array.copy())
            else:
                variable.assign(array)

    def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views into ``flat`` with the original shapes (no copy)."""
        if flat.size != self.size:
            raise ValueError(f"expected a vector of {self.size} floats, received {flat.size}")
        return [flat[start:stop].reshape(shape)
                for shape, start, stop in zip(self.shapes, self.offsets[:-1], self.offsets[1:])]
