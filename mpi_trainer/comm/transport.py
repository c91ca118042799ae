"""The MPI transport: the verbs one rank speaks, over ``mpi4py``.

The scheduler and the workers speak through a handful of verbs on
:class:`Transport`: small pickled messages between two ranks, flat float32
buffers broadcast, reduced or sent point to point, and a few set-up
collectives. Every verb counts the bytes its rank sends. The verbs are put
together from the modules of :mod:`mpi_trainer.comm`, one concern each:

* :mod:`.accounting`: who this rank is, the bytes it sent and the time it waited;
* :mod:`.waits`: every wait for a peer sleeps and is bounded (a verb called
  without a ``timeout`` waits at most ``bound`` seconds; the job sets it), and a
  timeout names this rank's ``phase`` and the missing ranks and their hosts;
* :mod:`.handshakes`: bulk payloads move with the blocking call only once every
  participant is known to be there;
* :mod:`.failures`: failure notices, a lost peer as ``RankLost``, ULFM's shrink,
  and the abort hook.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np

from mpi_trainer.comm.accounting import RankAccounting, Received, Shrunk
from mpi_trainer.comm.failures import (
    FAILURE_CLASSES,
    FailureHandling,
    PeerFailure,
    fault_tolerance_problem,
    install_abort_on_error,
    notice_text,
    surfacing_failures,
)
from mpi_trainer.comm.handshakes import ANNOUNCE_BYTES, TAG_CLEAR, Handshakes
from mpi_trainer.comm.waits import DEFAULT_MAX_SLEEP, StuckGuard, TransportTimeout

# What other modules import from here, whichever module of mpi_trainer.comm defines it.
__all__ = ["MAX_MESSAGE_BYTES", "PeerFailure", "RankAccounting", "Received", "Shrunk", "Transport",
           "TransportTimeout", "fault_tolerance_problem", "install_abort_on_error", "notice_text"]

# MPI counts are C ints: one message carries fewer than 2**31 elements, so data
# arrays travel as byte chunks of at most 1 GiB.
MAX_MESSAGE_BYTES = 1 << 30


class Transport(Handshakes, FailureHandling, RankAccounting):
    """MPI verbs for one rank, with byte counters and non-spinning waits.

    ``max_sleep = 0`` turns every wait into a plain blocking MPI call (no
    readiness messages); it is kept for the benchmark that shows what the
    polling saves. ``timeout`` bounds the wait for peers to arrive; once all
    have, the transfer runs at the blocking call's speed.
    """

    def __init__(self, comm: Any = None, max_sleep: float = DEFAULT_MAX_SLEEP) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self._start_accounting(self.comm.Get_rank(), self.comm.Get_size(), MPI.Get_processor_name())
        self.max_sleep = max_sleep
        self.max_message_bytes = MAX_MESSAGE_BYTES
        self.announce_bytes = ANNOUNCE_BYTES
        self._failure_classes = {getattr(MPI, name) for name in FAILURE_CLASSES if hasattr(MPI, name)}
        self._guard: StuckGuard | None = None

    # -- small objects ----------------------------------------------------
    @surfacing_failures
    def send_object(self, obj: Any, dest: int, tag: int, timeout: float | None = None) -> int:
        """Send a picklable object; a large one (an optimizer state) is announced first."""
        timeout = self._limit(timeout)
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) >= self.announce_bytes:
            self._announce(dest, tag, timeout, f"receiver for a {len(data)}-byte object")
            with self._bulk(timeout, "object send"):
                self.comm.Send([data, self._mpi.BYTE], dest, tag)
        else:
            self._wait(self.comm.Isend([data, self._mpi.BYTE], dest, tag), "object send", timeout, dest)
        self._count(len(data))
        return len(data)

    @surfacing_failures
    def recv_object(self, source: int = -1, tag: int = 0, timeout: float | None = None,
                    due: float | None = None) -> Received:
        """The next object on ``tag``; ``due``: when it is expected (``time.perf_counter()``), if known."""
        timeout = self._limit(timeout)
        source = self._mpi.ANY_SOURCE if source < 0 else source
        status = self._receive_status(source, tag, timeout, due=due)
        nbytes = status.Get_count(self._mpi.BYTE)
        data = bytearray(nbytes)
        with self._bulk(timeout, "object receive"):
            self.comm.Recv([data, self._mpi.BYTE], status.Get_source(), tag)
        return Received(pickle.loads(data), status.Get_source(), nbytes)

    # -- flat float32 buffers ---------------------------------------------
    @surfacing_failures
    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Broadcast ``buf`` in place from ``root`` to every rank."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights broadcast")
        with self._bulk(timeout, "weights broadcast"):
            self.comm.Bcast(buf, root=root)
        if self.rank == root:
            self._count(buf.nbytes * (self.size - 1))

    @surfacing_failures
    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Sum every rank's ``buf`` into ``buf`` at ``root`` (whose own ``buf`` is added too)."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights reduction")
        with self._bulk(timeout, "weights reduction"):
            if self.rank == root:
                self.comm.Reduce(self._mpi.IN_PLACE, buf, op=self._mpi.SUM, root=root)
            else:
                self.comm.Reduce(buf, None, op=self._mpi.SUM, root=root)
        if self.rank != root:
            self._count(buf.nbytes)

    @surfacing_failures
    def gather(self, buf: np.ndarray, out: np.ndarray | None = None, root: int = 0,
               timeout: float | None = None) -> None:
        """Every rank's ``buf`` into row ``rank`` of ``out`` (shape ``(size, *buf.shape)``) at ``root``."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights gather")
        with self._bulk(timeout, "weights gather"):
            self.comm.Gather(buf, out if self.rank == root else None, root=root)
        if self.rank != root:
            self._count(buf.nbytes)

    @surfacing_failures
    def send_array(self, buf: np.ndarray, dest: int, tag: int = 0,
                   timeout: float | None = None) -> None:
        """Send ``buf``; from ``announce_bytes`` on, once the receiver is ready for it."""
        timeout = self._limit(timeout)
        if buf.nbytes >= self.announce_bytes:
            self._announce(dest, tag, timeout, "receiver for the weights")
            with self._bulk(timeout, "weights send"):
                self.comm.Send(buf, dest, tag)
        else:
            self._wait(self.comm.Isend(buf, dest, tag), "weights send", timeout, dest)
        self._count(buf.nbytes)

    @surfacing_failures
    def recv_array(self, buf: np.ndarray, source: int = -1, tag: int = 0,
                   timeout: float | None = None) -> Received:
        """Receive into ``buf``; the message must have exactly ``buf.nbytes`` bytes."""
        timeout = self._limit(timeout)
        source = self._mpi.ANY_SOURCE if source < 0 else source
        status = self._receive_status(source, tag, timeout, expected=buf.nbytes)
        nbytes = status.Get_count(self._mpi.BYTE)
        if nbytes != buf.nbytes:
            raise RuntimeError(f"expected {buf.nbytes} bytes of weights from rank "
                               f"{status.Get_source()}, received {nbytes}")
        with self._bulk(timeout, "weights receive"):
            self.comm.Recv(buf, status.Get_source(), tag)
        return Received(buf, status.Get_source(), nbytes)

    # -- data arrays of any size (scatter placement) ----------------------
    @surfacing_failures
    def send_large_array(self, array: np.ndarray, dest: int, tag: int = 0,
                         timeout: float | None = None) -> None:
        """Send any numeric array: a small header, then byte chunks of at most ``max_message_bytes``.

        From ``announce_bytes`` on the header is the announcement: the chunks go
        once the receiver is ready. ``timeout`` bounds that wait (for a small
        array, the wait for each chunk to be taken); TimeoutError after it.
        """
        timeout = self._limit(timeout)
        array = np.ascontiguousarray(array)
        announced = array.nbytes >= self.announce_bytes and not self._blocking(timeout)
        self.send_object((array.shape, array.dtype.str, announced), dest, tag, timeout)
        if announced:
            self._wait_for_peer(dest, TAG_CLEAR, timeout, "receiver for the data")
        flat = array.reshape(-1).view(np.uint8)
        for start in range(0, flat.nbytes, self.max_message_bytes):
            chunk = [flat[start:start + self.max_message_bytes], self._mpi.BYTE]
            if announced:
                with self._bulk(timeout, "data send"):
                    self.comm.Send(chunk, dest, tag)
            else:
                self._wait(self.comm.Isend(chunk, dest, tag), "data send", timeout, dest)
            self._count(chunk[0].nbytes)

    @surfacing_failures
    def recv_large_array(self, source: int, tag: int = 0, timeout: float | None = None) -> np.ndarray:
        """Receive what :meth:`send_large_array` sent, chunk by chunk, whatever the sender's chunk size."""
        timeout = self._limit(timeout)
        shape, dtype, announced = self.recv_object(source, tag, timeout).payload
        if announced:
            self._send_nothing(source, TAG_CLEAR)
        array = np.empty(shape, dtype=np.dtype(dtype))
        flat = array.reshape(-1).view(np.uint8)
        filled = 0
        while filled < flat.nbytes:
            status = self._probe(source, tag, timeout)
            size = status.Get_count(self._mpi.BYTE)
            with self._bulk(timeout, "data receive"):
                self.comm.Recv([flat[filled:filled + size], self._mpi.BYTE], source, tag)
            filled += size
        return array

    # -- set-up collectives -------------------------------------------------
    @surfacing_failures
    def allgather(self, obj: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order; the ranks meet first, so a missing one is named."""
        timeout = self._limit(timeout)
        self._rendezvous(0, timeout, "set-up agreement")
        with self._bulk(timeout, "set-up agreement"):
            return self.comm.allgather(obj)

    @surfacing_failures
    def bcast_object(self, obj: Any = None, root: int = 0, timeout: float | None = None) -> Any:
        """``obj`` from ``root`` on every rank (set-up: the job's plan)."""
        timeout = self._limit(timeout)
        if self.rank == root:
            self._count(len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)) * (self.size - 1))
        self._rendezvous(root, timeout, "set-up broadcast")
        with self._bulk(timeout, "set-up broadcast"):
            return self.comm.bcast(obj, root=root)

    def learn_hosts(self) -> list[str]:
        """Every rank's host, kept so that a later timeout names where a missing rank runs."""
        self.hosts = self.allgather(self.host)
        return self.hosts

    def node_layout(self) -> tuple[int, list[int]]:
        """This node's core count and the world ranks that share this node."""
        timeout = self._limit(None)
        self._rendezvous(0, timeout, "node layout")
        with self._bulk(timeout, "node layout"):
            local = self.comm.Split_type(self._mpi.COMM_TYPE_SHARED, key=self.rank)
            try:
                node_ranks = local.allgather(self.rank)
            finally:
                local.Free()
        return os.cpu_count() or 1, sorted(node_ranks)

    @surfacing_failures
    def barrier(self, timeout: float | None = None) -> None:
        self._wait(self.comm.Ibarrier(), "barrier", self._limit(timeout))

    def duplicate(self, timeout: float | None = None) -> Transport:
        """A transport on a new communicator with this one's settings: a job's messages stay in its own.

        A job that fails part-way leaves messages nobody takes (a report, an arrival); in the
        job's own communicator they cannot reach the next job of the same processes.
        """
        comm, request = self.comm.Idup()
        self._wait(request, "new communicator", self._limit(timeout))
        twin = Transport(comm, self.max_sleep)
        twin.bound, twin.phase, twin.hosts = self.bound, self.phase, self.hosts
        return twin

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)
