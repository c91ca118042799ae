"""Keras weight lists <-> one contiguous float32 buffer, the unit that travels."""

from __future__ import annotations

from collections.abc import Sequence

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

    def flatten(self, weights: Sequence[np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        if len(weights) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} weight arrays, received {len(weights)}")
        out = self.empty() if out is None else out
        for array, shape, start, stop in zip(weights, self.shapes, self.offsets[:-1], self.offsets[1:]):
            if tuple(np.shape(array)) != shape:
                raise ValueError(f"weight shape mismatch: expected {shape}, received {np.shape(array)}")
            out[start:stop] = np.ravel(array)
        return out

    def unflatten(self, flat: np.ndarray) -> list[np.ndarray]:
        """Views into ``flat`` with the original shapes (no copy)."""
        if flat.size != self.size:
            raise ValueError(f"expected a vector of {self.size} floats, received {flat.size}")
        return [flat[start:stop].reshape(shape)
                for shape, start, stop in zip(self.shapes, self.offsets[:-1], self.offsets[1:])]
