"""The dtype weights travel in (``aggregation.wire_dtype``), and the one verb that sums them at the root.

float32, or 16 bits to halve the bytes.

The global model and every sum stay float32: a 16-bit wire format only
changes what crosses the network. ``float16`` keeps 10 mantissa bits and a
range up to 65,504; ``bfloat16`` keeps float32's range with 7 mantissa bits.
NumPy has no bfloat16, so it travels as the upper 16 bits of the float32
pattern (``uint16``), rounded to nearest even, which is the format's
definition.

:meth:`WireFormat.sum_to_root` is the only place that decides how weights
in the wire dtype are summed: MPI sums float32 itself (one sum-reduction),
but it has no 16-bit float sum, so 16-bit contributions are gathered and the
root decodes and adds them in float32. Every rank calls the same verb (a worker
with its contribution, the root with zeros), so neither the worker nor the
engine asks which collective runs, as with Horovod's compression objects.
"""

from __future__ import annotations

import numpy as np

from mpi_trainer.comm.interface import RankTransport
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
    def summed_by_mpi(self) -> bool:
        """Whether MPI can add values of the wire dtype (float32), else they are gathered and added at the root."""
        return self.name == "float32"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def empty(self, size: int) -> np.ndarray:
        return np.zeros(size, dtype=self.dtype)

    def landing(self, out: np.ndarray) -> np.ndarray:
        """The buffer that weights bound for ``out`` (float32) arrive in: ``out`` itself when the wire
        dtype is float32, else a wire-dtype buffer to :meth:`decode` into ``out``."""
        return out if self.name == "float32" else self.empty(out.size)

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

    def sum_to_root(self, transport: RankTransport, values: np.ndarray, root: int = 0,
                    timeout: float | None = None) -> np.ndarray:
        """Every rank's float32 ``values`` summed in float32 at ``root``, whatever the wire dtype.

        Each rank sends ``values`` encoded in the wire dtype (its bytes are counted as such). Returns
        the sum at ``root`` (for float32, in ``values`` itself), and ``values`` unchanged elsewhere.
        """
        wire = self.encode(values)
        if self.summed_by_mpi:
            transport.reduce_sum(wire, root=root, timeout=timeout)
            return wire
        rows = np.zeros((transport.size, wire.size), dtype=self.dtype) if transport.rank == root else None
        transport.gather(wire, rows, root=root, timeout=timeout)
        if transport.rank != root:
            return values
        summed = np.zeros(values.size, dtype=np.float32)
        for row in rows:  # in rank order: the same sum every run
            summed += self.decode(row)
        return summed
