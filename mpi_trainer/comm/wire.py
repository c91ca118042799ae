"""The dtype weights travel in (``aggregation.wire_dtype``): float32, or 16 bits to halve the bytes.

The global model and every sum stay float32: a 16-bit wire format only
changes what crosses the network. ``float16`` keeps 10 mantissa bits and a
range up to 65,504; ``bfloat16`` keeps float32's range with 7 mantissa bits.
NumPy has no bfloat16, so it travels as the upper 16 bits of the float32
pattern (``uint16``), rounded to nearest even, which is the format's
definition.
"""

from __future__ import annotations

import numpy as np

from mpi_trainer.config.schema import WIRE_DTYPES

_BFLOAT16_NAN = np.uint16(0x7FC0)


class WireFormat:
    """Encode float32 weight vectors into the wire dtype and back."""

    def __init__(self, name: str = "float32") -> None:
        if name not in WIRE_DTYPES:
            raise ValueError(f"wire dtype must be one of {list(WIRE_DTYPES)}. Received: {name!r}")
        self.name = name
        self.dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}[name]

    @property
    def compressed(self) -> bool:
        return self.name != "float32"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def empty(self, size: int) -> np.ndarray:
        return np.zeros(size, dtype=self.dtype)

    def encode(self, weights: np.ndarray) -> np.ndarray:
        """``weights`` (float32) in the wire dtype; float32 is passed through without a copy."""
        if self.name == "float32":
            return weights
        if self.name == "float16":
            return weights.astype(np.float16)
        bits = np.ascontiguousarray(weights, dtype=np.float32).view(np.uint32)
        rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16).astype(np.uint16)
        return np.where(np.isnan(weights), _BFLOAT16_NAN, rounded)

    def decode(self, wire: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The float32 values of ``wire``, written into ``out`` when given."""
        if self.name == "bfloat16":
            values = (wire.astype(np.uint32) << 16).view(np.float32)
        else:
            values = wire.astype(np.float32, copy=False)
        if out is None:
            return np.array(values, dtype=np.float32)
        out[...] = values
        return out
