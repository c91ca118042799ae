"""The dtype weights travel in (``aggregation.wire_dtype``), and the two verbs that move them: a sum to the
root and a broadcast from it.

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
scheduler asks which collective runs, as with Horovod's compression objects.

A 16-bit sum travels in segments of :data:`SEGMENT` values: each rank encodes a
segment into a small buffer and gathers it, and the root adds the segment it
has while the next one is on the wire (a thread; NumPy and mpi4py release the
GIL). No rank holds a full-size 16-bit copy, the root's additions read each
contribution once, and the casts overlap the transfer, a part as large as a
float32 sum's (:data:`ADD_PART`) at a time, so each part's additions run in cache.
A 16-bit broadcast (:meth:`WireFormat.broadcast_from_root`) goes the same way,
segment by segment: the root encodes a segment into a small buffer and
broadcasts it, and every other rank decodes it into its float32 weights as the
next one is encoded.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from mpi_trainer.algorithms.passes import CHUNK
from mpi_trainer.comm.interface import REDUCE_PART_BYTES, RankTransport
from mpi_trainer.config.schema import WIRE_DTYPES

_BFLOAT16_NAN = np.uint16(0x7FC0)
SEGMENT = 1 << 22  # values per gathered segment of a 16-bit sum: 8 MB a rank, enough to reach MPI's bandwidth
ADD_PART = REDUCE_PART_BYTES // 4  # float32 values added at a time: as a float32 sum's parts


class WireFormat:
    """Encode float32 weight vectors into the wire dtype and back."""

    def __init__(self, name: str = "float32") -> None:
        named = [dtype for dtype in WIRE_DTYPES if dtype != "auto"]  # "auto" is resolved at the job's start
        if name not in named:
            raise ValueError(f"wire dtype must be one of {named}. Received: {name!r}")
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

    def encode(self, weights: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``weights`` (float32) in the wire dtype, into ``out`` when given; float32 is passed through
        without a copy (into ``out`` only when it is another buffer)."""
        if self.name == "float32":
            if out is None or out is weights:
                return weights
            np.copyto(out, weights)
            return out
        out = self.empty(weights.size) if out is None else out
        if self.name == "float16":
            np.copyto(out, weights, casting="same_kind")
            return out
        scratch = np.empty(min(CHUNK, weights.size), np.uint32)
        for start in range(0, weights.size, CHUNK):
            stop = min(start + CHUNK, weights.size)
            self._bfloat16_chunk(weights[start:stop], out[start:stop], scratch[:stop - start])
        return out

    @staticmethod
    def _bfloat16_chunk(values: np.ndarray, out: np.ndarray, bits: np.ndarray) -> None:
        """Round ``values`` to nearest even in their upper 16 bits; NaN stays a (quiet) NaN."""
        source = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        np.right_shift(source, 16, out=bits)
        bits &= np.uint32(1)
        bits += np.uint32(0x7FFF)
        bits += source
        bits >>= 16
        np.copyto(out, bits, casting="unsafe")
        nan = np.isnan(values)
        if nan.any():
            out[nan] = _BFLOAT16_NAN

    def decode(self, wire: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The float32 values of ``wire``, written into ``out`` when given."""
        out = np.empty(wire.size, np.float32).reshape(wire.shape) if out is None else out
        if self.name == "bfloat16":
            bits = out.view(np.uint32)
            np.copyto(bits, wire, casting="safe")
            bits <<= 16
        else:
            np.copyto(out, wire, casting="safe")
        return out

    def add_decoded(self, wire: np.ndarray, out: np.ndarray, scratch: np.ndarray) -> None:
        """``out += decode(wire)`` chunk by chunk (``scratch``: float32, at least a chunk)."""
        for start in range(0, wire.size, CHUNK):
            stop = min(start + CHUNK, wire.size)
            piece = scratch[:stop - start]
            self.decode(wire[start:stop], piece)
            out[start:stop] += piece

    def broadcast_from_root(self, transport: RankTransport, values: np.ndarray, root: int = 0,
                            timeout: float | None = None) -> None:
        """The root's float32 ``values`` into every other rank's ``values``, carried in the wire dtype (its
        bytes are counted as such); 16 bits go segment by segment, so no rank holds a 16-bit copy."""
        if self.name == "float32":
            transport.broadcast(values, root=root, timeout=timeout)
            return
        segment = min(SEGMENT, values.size) or 1
        wire = self.empty(segment)
        for start in range(0, values.size, segment):
            stop = min(start + segment, values.size)
            part = wire[:stop - start]
            if transport.rank == root:
                self.encode(values[start:stop], part)
            transport.broadcast(part, root=root, timeout=timeout)
            if transport.rank != root:
                self.decode(part, values[start:stop])

    def sum_to_root(self, transport: RankTransport, values: np.ndarray, root: int = 0,
                    timeout: float | None = None) -> np.ndarray:
        """Every rank's float32 ``values`` summed in float32 at ``root``, whatever the wire dtype.

        Each rank sends ``values`` encoded in the wire dtype (its bytes are counted as such). Returns
        the sum at ``root`` in ``values`` itself, and ``values`` unchanged elsewhere.
        """
        if self.summed_by_mpi:
            transport.reduce_sum(values, root=root, timeout=timeout)
            return values
        segment = min(SEGMENT, values.size) or 1  # a model below a segment travels in one gather
        wire = self.empty(segment)
        if transport.rank != root:
            for start in range(0, values.size, segment):
                stop = min(start + segment, values.size)
                transport.gather(self.encode(values[start:stop], wire[:stop - start]), None, root=root,
                                 timeout=timeout)
            return values
        self._sum_at_root(transport, values, root, timeout)
        return values

    def _sum_at_root(self, transport: RankTransport, values: np.ndarray, root: int, timeout: float | None) -> None:
        """The root's side: gather segment after segment into two alternating buffers, and while the next
        travels, add the one that arrived into ``values`` (float32, holding the root's own contribution)
        a :data:`ADD_PART` at a time."""
        size = values.size
        segment = min(SEGMENT, size) or 1  # a model below a segment travels in one gather
        rows = [np.zeros(transport.size * segment, dtype=self.dtype) for _ in range(2)]
        scratch = np.empty(min(CHUNK, segment), np.float32)
        wire = self.empty(segment)
        pending: Future[None] | None = None
        with ThreadPoolExecutor(1) as adder:
            for index, start in enumerate(range(0, size, segment)):
                stop = min(start + segment, size)
                n = stop - start
                landing = rows[index % 2][:transport.size * n].reshape(transport.size, n)  # contiguous rows
                wire[:n] = 0
                transport.gather(wire[:n], landing, root=root, timeout=timeout)
                if pending is not None:
                    pending.result()  # the previous segment is summed: its buffers are free
                pending = adder.submit(self._add_rows, landing, values[start:stop], root, scratch)
            if pending is not None:
                pending.result()

    def _add_rows(self, rows: np.ndarray, out: np.ndarray, root: int, scratch: np.ndarray) -> None:
        for first in range(0, out.size, ADD_PART):
            last = min(first + ADD_PART, out.size)
            for rank, row in enumerate(rows):  # in rank order: the same sum every run
                if rank != root:
                    self.add_decoded(row[first:last], out[first:last], scratch)
