"""The only module that talks MPI.

The scheduler and the workers speak through a handful of verbs on
:class:`Transport`: small pickled messages between two ranks, flat float32
buffers broadcast, reduced or sent point to point, and a few set-up
collectives. Every verb counts the bytes its rank sends, and every wait is a
non-blocking request polled with short, growing sleeps, because a rank blocked
in a plain MPI receive spins a CPU core that the workers need for training.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

TAG_ORDER = 11
TAG_REPORT = 12
TAG_WEIGHTS = 13
TAG_DATA = 14
TAG_STATE = 15
TAG_READY = 16

# MPI counts are C ints: one message carries fewer than 2**31 elements, so data
# arrays travel as byte chunks of at most 1 GiB.
MAX_MESSAGE_BYTES = 1 << 30

# Polling back-off: first re-check after 20 us, doubling up to ``max_sleep``.
_FIRST_SLEEP = 2e-5
DEFAULT_MAX_SLEEP = 0.005


@dataclass
class Received:
    """A message taken off the wire: its payload, sender and size in bytes."""

    payload: Any
    source: int
    nbytes: int


class Transport:
    """MPI verbs for one rank, with byte counters and non-spinning waits.

    ``max_sleep = 0`` turns every wait into a plain blocking MPI call; it is
    kept for the benchmark that shows what the polling saves.
    """

    def __init__(self, comm: Any = None, max_sleep: float = DEFAULT_MAX_SLEEP) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.host = MPI.Get_processor_name()
        self.max_sleep = max_sleep
        self.max_message_bytes = MAX_MESSAGE_BYTES
        self.bytes_sent = 0
        self.total_bytes_sent = 0
        self.wait_wall_seconds = 0.0
        self.wait_cpu_seconds = 0.0

    @property
    def workers(self) -> int:
        return self.size - 1

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} on {self.host}"

    # -- accounting -------------------------------------------------------
    def _count(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.total_bytes_sent += nbytes

    def take_bytes(self) -> int:
        """Bytes this rank sent since the previous call."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    # -- waiting ----------------------------------------------------------
    def _poll(self, ready: Any, blocking: Any, timeout: float | None, what: str) -> None:
        """Call ``ready()`` with growing sleeps until it is true (or ``blocking()``)."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            if self.max_sleep <= 0 and timeout is None:
                blocking()
                return
            sleep = _FIRST_SLEEP
            while not ready():
                if timeout is not None and time.perf_counter() - wall0 > timeout:
                    raise TimeoutError(f"{self.describe()}: no {what} within {timeout:g} s")
                time.sleep(sleep)
                sleep = min(sleep * 2, max(self.max_sleep, _FIRST_SLEEP))
        finally:
            self.wait_wall_seconds += time.perf_counter() - wall0
            self.wait_cpu_seconds += time.process_time() - cpu0

    def _wait(self, request: Any, what: str = "completion", timeout: float | None = None) -> None:
        self._poll(request.Test, request.Wait, timeout, what)

    def _probe(self, source: int, tag: int, timeout: float | None) -> Any:
        status = self._mpi.Status()
        self._poll(
            lambda: self.comm.Iprobe(source, tag, status),
            lambda: self.comm.Probe(source, tag, status),
            timeout,
            f"message (tag {tag}) from {'any rank' if source < 0 else f'rank {source}'}",
        )
        return status

    # -- small objects ----------------------------------------------------
    def send_object(self, obj: Any, dest: int, tag: int) -> int:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._wait(self.comm.Isend([data, self._mpi.BYTE], dest, tag))
        self._count(len(data))
        return len(data)

    def recv_object(self, source: int = -1, tag: int = TAG_REPORT, timeout: float | None = None) -> Received:
        source = self._mpi.ANY_SOURCE if source < 0 else source
        status = self._probe(source, tag, timeout)
        nbytes = status.Get_count(self._mpi.BYTE)
        data = bytearray(nbytes)
        self.comm.Recv([data, self._mpi.BYTE], status.Get_source(), tag)
        return Received(pickle.loads(data), status.Get_source(), nbytes)

    def bcast_object(self, obj: Any = None, root: int = 0) -> Any:
        """Blocking broadcast, used only during set-up."""
        if self.rank == root:
            self._count(len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)) * (self.size - 1))
        return self.comm.bcast(obj, root=root)

    # -- flat float32 buffers ---------------------------------------------
    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Broadcast ``buf`` in place from ``root`` to every rank."""
        self._wait(self.comm.Ibcast(buf, root=root), "weights broadcast", timeout)
        if self.rank == root:
            self._count(buf.nbytes * (self.size - 1))

    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Sum every rank's ``buf`` into ``buf`` at ``root`` (whose own ``buf`` is added too)."""
        if self.rank == root:
            request = self.comm.Ireduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM, root=root)
        else:
            request = self.comm.Ireduce(buf, None, op=self._mpi.SUM, root=root)
            self._count(buf.nbytes)
        self._wait(request, "weights reduction", timeout)

    def send_array(self, buf: np.ndarray, dest: int, tag: int = TAG_WEIGHTS) -> None:
        self._wait(self.comm.Isend(buf, dest, tag), "weights send")
        self._count(buf.nbytes)

    def recv_array(self, buf: np.ndarray, source: int = -1, tag: int = TAG_WEIGHTS,
                   timeout: float | None = None) -> Received:
        """Receive into ``buf``; the message must have exactly ``buf.nbytes`` bytes."""
        source = self._mpi.ANY_SOURCE if source < 0 else source
        status = self._probe(source, tag, timeout)
        nbytes = status.Get_count(self._mpi.BYTE)
        if nbytes != buf.nbytes:
            raise RuntimeError(f"expected {buf.nbytes} bytes of weights from rank "
                               f"{status.Get_source()}, received {nbytes}")
        self.comm.Recv(buf, status.Get_source(), tag)
        return Received(buf, status.Get_source(), nbytes)

    # -- data arrays of any size (scatter placement) ----------------------
    def send_large_array(self, array: np.ndarray, dest: int, tag: int = TAG_DATA,
                         timeout: float | None = None) -> None:
        """Send any numeric array: a small header, then byte chunks of at most ``max_message_bytes``.

        ``timeout`` bounds the wait for each chunk to be taken (TimeoutError after it).
        """
        array = np.ascontiguousarray(array)
        self.send_object((array.shape, array.dtype.str), dest, tag)
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, flat.nbytes, self.max_message_bytes):
            chunk = flat[start:start + self.max_message_bytes]
            self._wait(self.comm.Isend([chunk, self._mpi.BYTE], dest, tag), "data send", timeout)
            self._count(chunk.nbytes)

    def recv_large_array(self, source: int, tag: int = TAG_DATA) -> np.ndarray:
        """Receive what :meth:`send_large_array` sent, chunk by chunk, whatever the sender's chunk size."""
        shape, dtype = self.recv_object(source, tag).payload
        array = np.empty(shape, dtype=np.dtype(dtype))
        flat = array.reshape(-1).view(np.uint8)
        filled = 0
        while filled < flat.nbytes:
            status = self._probe(source, tag, None)
            size = status.Get_count(self._mpi.BYTE)
            self.comm.Recv([flat[filled:filled + size], self._mpi.BYTE], source, tag)
            filled += size
        return array

    # -- set-up collectives -------------------------------------------------
    def allgather(self, obj: Any) -> list[Any]:
        return self.comm.allgather(obj)

    def node_layout(self) -> tuple[int, list[int]]:
        """This node's core count and the world ranks that share this node."""
        local = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=self.rank)
        try:
            node_ranks = local.allgather(self.rank)
        finally:
            local.Free()
        return os.cpu_count() or 1, sorted(node_ranks)

    def barrier(self) -> None:
        self._wait(self.comm.Ibarrier(), "barrier")

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def install_abort_on_error(transport: Transport) -> None:
    """Make an uncaught exception on this rank end the whole job promptly.

    The traceback goes to stderr under a header naming the rank and host, then
    ``MPI_Abort`` takes every other rank down, so nothing is left waiting.
    """

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"mpi_trainer: {transport.describe()} failed:\n{text}")
        sys.stderr.flush()
        sys.stdout.flush()
        transport.abort(1)

    sys.excepthook = hook
