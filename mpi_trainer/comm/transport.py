"""The MPI transport: the verbs one rank speaks, over ``mpi4py``.

The scheduler and the workers speak through a handful of verbs on
:class:`Transport`: small pickled messages between two ranks, flat float32
buffers broadcast, reduced or sent point to point, and a few set-up
collectives. Every verb counts the bytes its rank sends. One class owns the
communicator and everything done on it; what it is made of:

* its :class:`~.accounting.RankAccounting`: who this rank is, the bytes it sent and
  the time it waited (the in-process transport keeps the same);
* waits that sleep and are bounded (the pure parts in :mod:`.waits`): a verb called
  without a ``timeout`` waits at most ``bound`` seconds (the job sets it), and a
  timeout names this rank's ``phase`` and the missing ranks and their hosts;
* hand-shakes (tags in :mod:`.handshakes`): bulk payloads move with the blocking
  call only once every participant is known to be there;
* failures (shared parts in :mod:`.failures`): failure notices, a lost peer as
  ``RankLost``, ULFM's shrink and agreement, and the abort.
"""

from __future__ import annotations

import functools
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from mpi_trainer.comm.accounting import AccountedRank, IncomingArray, RankAccounting, Received, Shrunk
from mpi_trainer.comm.failures import (
    FAILURE_CLASSES,
    NOTICE_CHARS,
    NOTICE_SECONDS,
    TAG_FAILED,
    PeerFailure,
    abort_on_error,
    fault_tolerance_problem,
    install_abort_on_error,
    notice_text,
    prepare_mpi_environment,
)
from mpi_trainer.comm.handshakes import ANNOUNCE_BYTES, TAG_ARRIVED, TAG_CLEAR, TAG_GOING, TAG_PROCEED
from mpi_trainer.comm.interface import REDUCE_PART_BYTES
from mpi_trainer.comm.shared_memory import SHARED_MIN_BYTES, NodeSlots, shared_memory_wanted
from mpi_trainer.comm.waits import (
    DEFAULT_MAX_SLEEP,
    NOTHING,
    STUCK_TRANSFER_EXIT,
    StuckGuard,
    TransportTimeout,
    due_sleep,
    poll_sleep,
)
from mpi_trainer.errors import RankLost

if TYPE_CHECKING:
    from mpi4py import MPI

# What other modules import from here, whichever module of mpi_trainer.comm defines it.
__all__ = ["MAX_MESSAGE_BYTES", "PeerFailure", "RankAccounting", "Received", "Shrunk", "Transport",
           "TransportTimeout", "abort_on_error", "fault_tolerance_problem", "install_abort_on_error", "notice_text"]

# MPI counts are C ints: one message carries fewer than 2**31 elements, so data arrays travel as byte
# chunks. 64 MiB is far past the size where a message's fixed cost shows, and it bounds what a receiver
# that takes an array message by message (a checkpoint writing a worker's optimizer state as it arrives)
# holds at once: one chunk, not the whole array.
MAX_MESSAGE_BYTES = 1 << 26

_UNDECIDED = object()  # a transport's shared-memory slots before the first large collective decides them

P = ParamSpec("P")
R = TypeVar("R")


def surfacing_failures(verb: Callable[Concatenate[Transport, P], R]) -> Callable[Concatenate[Transport, P], R]:
    """A verb that raises :class:`RankLost` where MPI reports a failed peer or a revoked communicator."""

    @functools.wraps(verb)
    def wrapper(self: Transport, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return verb(self, *args, **kwargs)
        except self._mpi.Exception as exc:
            if exc.Get_error_class() not in self._failure_classes:
                raise
            raise RankLost(f"{self.describe()}: {exc.Get_error_string()}") from exc

    return wrapper


class Transport(AccountedRank):
    """MPI verbs for one rank, with byte counters and non-spinning waits.

    ``max_sleep = 0`` turns every wait into a plain blocking MPI call (no
    readiness messages); it is kept for the benchmark that shows what the
    polling saves. ``timeout`` bounds the wait for peers to arrive; once all
    have, the transfer runs at the blocking call's speed.
    """

    def __init__(self, comm: MPI.Comm | None = None, max_sleep: float = DEFAULT_MAX_SLEEP) -> None:
        """``comm``: the communicator to speak on; None: this process's ``MPI_COMM_WORLD`` (MPI starts
        here, at the first import of ``mpi4py.MPI``, so the environment it reads is prepared first)."""
        if comm is None:
            prepare_mpi_environment()
        from mpi4py import MPI

        self._mpi: ModuleType = MPI
        self.comm: MPI.Comm = comm if comm is not None else MPI.COMM_WORLD
        self.accounting = RankAccounting(self.comm.Get_rank(), self.comm.Get_size(), MPI.Get_processor_name())
        self.max_sleep = max_sleep
        self.bound: float | None = None  # seconds a wait without a timeout of its own may last (None: for ever)
        self.phase = "set-up"  # what this rank is doing, named when a wait runs out
        self.max_message_bytes = MAX_MESSAGE_BYTES
        self.announce_bytes = ANNOUNCE_BYTES
        self._failure_classes = {getattr(MPI, name) for name in FAILURE_CLASSES if hasattr(MPI, name)}
        self._guard: StuckGuard | None = None
        # one node's ranks meet in a shared window (decided at the first large collective; None: MPI's)
        self._slots: NodeSlots | None | object = _UNDECIDED

    def _limit(self, timeout: float | None) -> float | None:
        """A verb's own ``timeout``, else the transport's ``bound``."""
        return self.bound if timeout is None else timeout

    def _count(self, nbytes: int) -> None:
        self.accounting.count(nbytes)

    # -- waiting: every wait for a peer sleeps and is bounded ------------------------
    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Add the wall and CPU time of the block to this rank's time in the transport."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.accounting.add_wait(time.perf_counter() - wall0, time.process_time() - cpu0)

    @contextmanager
    def _bulk(self, timeout: float | None, what: str) -> Iterator[None]:
        """Time a blocking transfer that every peer has entered; past ``timeout``, end the job.

        A blocking MPI call cannot time out, and a peer stopped inside it would
        hold this rank for ever, so the transport's :class:`StuckGuard` names the
        transfer and aborts.
        """
        guard = self._guard_for(timeout)
        if guard is not None and timeout is not None:
            guard.arm(timeout, what)
        try:
            with self._timed():
                yield
        finally:
            if guard is not None:
                guard.disarm()

    def _guard_for(self, timeout: float | None) -> StuckGuard | None:
        """The guard that watches a blocking call bounded by ``timeout``: none without a bound, or
        where MPI does not allow threads (started at the first bounded call)."""
        if timeout is None:
            return None
        if self._guard is None and self._mpi.Query_thread() >= self._mpi.THREAD_MULTIPLE:
            self._guard = StuckGuard(self._abort_stuck)
        return self._guard

    def _abort_stuck(self, what: str, timeout: float) -> None:
        sys.stderr.write(f"mpi_trainer: error: {self.describe()}: the {what} did not complete within "
                         f"{timeout:g} s of every rank entering it (a peer stopped inside it); ending the job\n")
        sys.stderr.flush()
        self.abort(STUCK_TRANSFER_EXIT)

    def _blocking(self, timeout: float | None) -> bool:
        return self.max_sleep <= 0 and timeout is None

    def _poll(self, ready: Callable[[], bool], timeout: float | None, what: str,
              missing: Callable[[], list[int]] = list, due: float | None = None) -> None:
        """Call ``ready()`` with growing sleeps until it is true; TransportTimeout after ``timeout``.

        ``due`` (a ``time.perf_counter()`` time): when the awaited message is expected; see
        :func:`due_sleep`.
        """
        with self._timed():
            self._poll_untimed(ready, timeout, what, missing, due)

    def _poll_untimed(self, ready: Callable[[], bool], timeout: float | None, what: str,
                      missing: Callable[[], list[int]] = list, due: float | None = None) -> None:
        """:meth:`_poll` inside a block that is timed already."""
        started = time.perf_counter()
        while not ready():
            now = time.perf_counter()
            waited = now - started
            if timeout is not None and waited > timeout:
                raise self._timeout(what, timeout, missing())
            pause = poll_sleep(waited, self.max_sleep)
            if due is not None:
                pause = due_sleep(pause, now, started, due)
            if pause > 0:
                self.check_notices()  # once per sleep: a rank that failed and left is not waited for
                time.sleep(pause)

    def _timeout(self, what: str, timeout: float, missing: list[int]) -> TransportTimeout:
        named = f" (waiting for {self.accounting.name_ranks(missing)})" if missing else ""
        return TransportTimeout(f"{self.describe()}, {self.phase}: no {what} within {timeout:g} s{named}", missing)

    def _wait(self, request: MPI.Request, what: str = "completion", timeout: float | None = None,
              peer: int | None = None) -> None:
        """Wait for ``request``; a timeout names ``peer``, the rank it depends on, when there is one."""
        if self._blocking(timeout):
            with self._timed():
                request.Wait()
            return
        self._poll(request.Test, timeout, what, list if peer is None else lambda: [peer])

    def _wait_for_peer(self, peer: int, tag: int, timeout: float | None, what: str) -> None:
        """Sleep until an empty message arrives from ``peer`` on ``tag``.

        A receive still pending at the timeout is cancelled, so that a late
        message cannot complete it behind the caller's back.
        """
        request = self.comm.Irecv([NOTHING, self._mpi.BYTE], peer, tag)
        if self._blocking(timeout):
            with self._timed():
                request.Wait()
            return
        try:
            self._poll(request.Test, timeout, what, lambda: [peer])
        except TimeoutError:
            request.Cancel()
            request.Wait()
            raise

    def _probe(self, source: int, tag: int, timeout: float | None, due: float | None = None) -> MPI.Status:
        status: MPI.Status = self._mpi.Status()
        what = f"message (tag {tag}) from {'any rank' if source < 0 else f'rank {source}'}"
        if self._blocking(timeout):
            with self._timed():
                self.comm.Probe(source, tag, status)
        else:
            self._poll(lambda: self.comm.Iprobe(source, tag, status), timeout, what,
                       lambda: [] if source < 0 else [source], due)
        return status

    # -- hand-shakes -----------------------------------------------------------
    def _send_nothing(self, dest: int, tag: int) -> None:
        """An empty message: MPI sends it eagerly, so the request is complete when posted."""
        self.comm.Isend([NOTHING, self._mpi.BYTE], dest, tag).Wait()

    def _gather_nothing(self, others: set[int], tag: int, timeout: float | None, what: str) -> None:
        """Root: sleep until every rank in ``others`` has sent it an empty message on ``tag``."""
        heard: set[int] = set()
        status = self._mpi.Status()

        def everyone() -> bool:
            while len(heard) < len(others) and self.comm.Iprobe(self._mpi.ANY_SOURCE, tag, status):
                self.comm.Recv([NOTHING, self._mpi.BYTE], status.Get_source(), tag)
                heard.add(status.Get_source())
            return len(heard) == len(others)

        self._poll(everyone, timeout, what, lambda: sorted(others - heard))

    def _rendezvous(self, root: int, timeout: float | None, what: str) -> None:
        """Return once every rank of the communicator is at this collective, ready to move the payload.

        Three steps, each rank's waits sleeping: all tell the root they arrived; the
        root tells all to proceed; all confirm. The root enters the blocking collective
        only after the confirmations, so a rank stopped while it waited (a fast worker
        waiting for a slow one) is named by the timeout instead of hanging the root.
        """
        if self._blocking(timeout) or self.size == 1:
            return
        if self.rank != root:
            self._send_nothing(root, TAG_ARRIVED)
            self._wait_for_peer(root, TAG_PROCEED, timeout, what)
            self._send_nothing(root, TAG_GOING)
            return
        others = set(range(self.size)) - {root}
        self._gather_nothing(others, TAG_ARRIVED, timeout, what)
        for rank in sorted(others):
            self._send_nothing(rank, TAG_PROCEED)
        self._gather_nothing(others, TAG_GOING, timeout, what)

    def _announce(self, dest: int, tag: int, timeout: float | None, what: str) -> None:
        """Sender: tell ``dest`` a large payload is coming on ``tag``; sleep until it is ready for it."""
        if self._blocking(timeout):
            return
        self._send_nothing(dest, tag)
        self._wait_for_peer(dest, TAG_CLEAR, timeout, what)

    def _accept(self, status: MPI.Status, tag: int, timeout: float | None) -> MPI.Status:
        """Receiver: take the announcement ``status`` describes, clear the sender, probe the payload.

        The payload follows within one of the sender's polling sleeps; the probe
        still sleeps and times out, for a sender stopped before it sent.
        """
        sender = status.Get_source()
        self.comm.Recv([NOTHING, self._mpi.BYTE], sender, tag)
        self._send_nothing(sender, TAG_CLEAR)
        return self._probe(sender, tag, timeout)

    def _receive_status(self, source: int, tag: int, timeout: float | None, expected: int = -1,
                        due: float | None = None) -> MPI.Status:
        """The status of the next payload on ``tag``, after accepting an announcement if one comes first."""
        status = self._probe(source, tag, timeout, due)
        if status.Get_count(self._mpi.BYTE) == 0 and expected != 0:
            status = self._accept(status, tag, timeout)
        return status

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

    # -- one node's shared memory (:mod:`~mpi_trainer.comm.shared_memory`) -----------------
    def _shared(self, nbytes: int, root: int) -> NodeSlots | None:
        """The node's slots when a collective of ``nbytes`` to or from rank 0 meets in shared memory (and
        across nodes, between their leaders); None for MPI's own. Collective: every rank asks at the same
        collective, with the same ``nbytes``."""
        if nbytes < SHARED_MIN_BYTES or self.size == 1 or root != 0 or not shared_memory_wanted():
            return None
        if self._slots is _UNDECIDED:
            self._slots = NodeSlots.for_comm(self.comm, self._mpi)
        return self._slots if isinstance(self._slots, NodeSlots) else None

    def release(self) -> None:
        """Give back the node's shared window, if a collective made one: at the end of a job, on every rank
        (collective). Later collectives go through MPI."""
        if isinstance(self._slots, NodeSlots):
            self._slots.free()
        self._slots = None

    def _node_barrier(self, slots: NodeSlots, timeout: float | None, what: str) -> Callable[[], None]:
        """A wait for every rank of the node, polled (a waiting rank sleeps instead of spinning) and bounded,
        inside a block that is timed already."""
        return lambda: self._poll_untimed(slots.comm.Ibarrier().Test, timeout, what)

    # -- flat float32 buffers ---------------------------------------------
    @surfacing_failures
    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Broadcast ``buf`` in place from ``root`` to every rank."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights broadcast")
        slots = self._shared(buf.nbytes, root) if buf.flags.c_contiguous else None
        if slots is not None:
            with self._bulk(timeout, "weights broadcast"):
                slots.broadcast(buf.reshape(-1), self._node_barrier(slots, timeout, "weights broadcast"))
        else:
            with self._bulk(timeout, "weights broadcast"):
                self.comm.Bcast(buf, root=root)
        if self.rank == root:
            self._count(buf.nbytes * (self.size - 1))

    @surfacing_failures
    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                   on_part: Callable[[int, int], None] | None = None) -> None:
        """Sum every rank's ``buf`` (contiguous) into ``buf`` at ``root`` (whose own ``buf`` is added too),
        part by part (:data:`REDUCE_PART_BYTES`, or the node's shared slots). ``on_part(start, stop)``: called
        at the root as each part's sum is complete, in order, while the next part travels (rank 0 combines a
        round's state there, in cache and overlapped with the transfer)."""
        self._reduce(buf, root, timeout, on_part, False, True, None)

    @surfacing_failures
    def reduce_broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                         on_part: Callable[[int, int], None] | None = None, root_adds: bool = True,
                         on_returned: Callable[[int, int], None] | None = None) -> None:
        """:meth:`reduce_sum`, then ``root``'s result (each part as ``on_part`` left it) in every rank's ``buf``,
        part by part: through the node's shared slots each part of the result goes out while the next is
        summed, and across nodes it travels back while the next part's sum travels in (a round's combined
        state returns to the workers in the pass that collects their states). Through MPI's collectives
        each part is reduced, then broadcast. ``root_adds`` False: the root's own ``buf`` is not added (nor
        read), it takes the others' sum. ``on_returned(start, stop)``: at every other rank, as each part
        of the result has arrived in ``buf``, in order (a worker writes it into its model while later parts
        are summed)."""
        self._reduce(buf, root, timeout, on_part, True, root_adds, on_returned)

    def _reduce(self, buf: np.ndarray, root: int, timeout: float | None, on_part: Callable[[int, int], None] | None,
                returned: bool, root_adds: bool, on_returned: Callable[[int, int], None] | None) -> None:
        what = "weights reduction and return" if returned else "weights reduction"
        flat = in_place(buf, "a sum-reduction that returns its result" if returned else "a sum-reduction")
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights reduction")
        slots = self._shared(buf.nbytes, root)
        part = max(1, REDUCE_PART_BYTES // buf.itemsize)
        with self._bulk(timeout, what):
            if slots is not None:
                slots.reduce(flat, self.rank == root, self._node_barrier(slots, timeout, what),
                             on_part if self.rank == root else None, returned, root_adds,
                             None if self.rank == root else on_returned)
            else:
                for start in range(0, flat.size, part):
                    values = flat[start:start + part]
                    if self.rank == root:
                        if not root_adds:
                            values[...] = 0
                        self.comm.Reduce(self._mpi.IN_PLACE, values, op=self._mpi.SUM, root=root)
                        if on_part is not None:
                            on_part(start, start + values.size)
                    else:
                        self.comm.Reduce(values, None, op=self._mpi.SUM, root=root)
                    if returned:
                        self.comm.Bcast(values, root=root)
                        if self.rank != root and on_returned is not None:
                            on_returned(start, start + values.size)
        if self.rank != root:
            self._count(buf.nbytes)
        elif returned:
            self._count(buf.nbytes * (self.size - 1))

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
        array = np.ascontiguousarray(array)
        self.send_array_parts([array.reshape(-1)], array.shape, array.dtype, dest, tag, timeout)

    @surfacing_failures
    def send_array_parts(self, parts: Iterable[np.ndarray], shape: tuple[int, ...], dtype: Any, dest: int,
                         tag: int = 0, timeout: float | None = None) -> None:
        """Send one array of ``shape`` and ``dtype`` given as ``parts`` (its elements in order, each a flat
        array of ``dtype``), as :meth:`send_large_array` sends it whole: the receiver's
        :meth:`recv_large_array` gets the one array. A generator of parts has one in memory at a time."""
        timeout, dtype = self._limit(timeout), np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        announced = nbytes >= self.announce_bytes and not self._blocking(timeout)
        self.send_object((tuple(shape), dtype.str, announced), dest, tag, timeout)
        if announced:
            self._wait_for_peer(dest, TAG_CLEAR, timeout, "receiver for the data")
        sent = 0
        for part in parts:
            sent += self._send_bytes(np.ascontiguousarray(part, dtype=dtype), dest, tag, timeout, announced)
            del part  # the next part may be as large: this one is sent
        if sent != nbytes:
            raise ValueError(f"the parts of an array of shape {tuple(shape)} ({nbytes} bytes) held {sent} bytes")

    def _send_bytes(self, array: np.ndarray, dest: int, tag: int, timeout: float | None, announced: bool) -> int:
        """A contiguous array's bytes in chunks of at most ``max_message_bytes``; returns their count."""
        flat = array.reshape(-1).view(np.uint8)
        step = max(array.itemsize, self.max_message_bytes - self.max_message_bytes % array.itemsize)
        for start in range(0, flat.nbytes, step):  # whole elements in every message
            chunk = [flat[start:start + step], self._mpi.BYTE]
            if announced:
                with self._bulk(timeout, "data send"):
                    self.comm.Send(chunk, dest, tag)
            else:
                self._wait(self.comm.Isend(chunk, dest, tag), "data send", timeout, dest)
            self._count(chunk[0].nbytes)
        return int(flat.nbytes)

    @surfacing_failures
    def recv_large_array(self, source: int, tag: int = 0, timeout: float | None = None) -> np.ndarray:
        """Receive what :meth:`send_large_array` sent, chunk by chunk, whatever the sender's chunk size."""
        timeout = self._limit(timeout)
        incoming = self.recv_large_array_header(source, tag, timeout)
        array = np.empty(incoming.shape, dtype=incoming.dtype)
        flat, filled = array.reshape(-1).view(np.uint8), 0
        while filled < flat.nbytes:
            filled += self._recv_chunk(incoming, flat[filled:], timeout)
        return array

    @surfacing_failures
    def recv_large_array_header(self, source: int, tag: int = 0, timeout: float | None = None) -> IncomingArray:
        """The header of what :meth:`send_large_array` or :meth:`send_array_parts` sent: its shape and
        dtype. :meth:`recv_large_array_body` takes the elements."""
        timeout = self._limit(timeout)
        shape, dtype, announced = self.recv_object(source, tag, timeout).payload
        if announced:
            self._send_nothing(source, TAG_CLEAR)
        return IncomingArray(tuple(shape), np.dtype(dtype), source, tag)

    @surfacing_failures
    def recv_large_array_body(self, incoming: IncomingArray, take: Callable[[np.ndarray], None],
                              timeout: float | None = None) -> None:
        """The elements of ``incoming``, handed to ``take`` as flat arrays in order, one message at a time (at
        most ``max_message_bytes``, in one buffer reused for the next): the whole array is never held."""
        timeout = self._limit(timeout)
        total = int(np.prod(incoming.shape, dtype=np.int64)) * incoming.dtype.itemsize
        buffer, received = np.empty(0, np.uint8), 0
        while received < total:
            size = self._probe(incoming.source, incoming.tag, timeout).Get_count(self._mpi.BYTE)
            if buffer.nbytes < size:
                buffer = np.empty(size, np.uint8)
            with self._bulk(timeout, "data receive"):
                self.comm.Recv([buffer[:size], self._mpi.BYTE], incoming.source, incoming.tag)
            received += size
            take(buffer[:size].view(incoming.dtype))

    def _recv_chunk(self, incoming: IncomingArray, into: np.ndarray, timeout: float | None) -> int:
        """The next message of ``incoming``'s elements, into the front of ``into`` (bytes); returns its size."""
        size = int(self._probe(incoming.source, incoming.tag, timeout).Get_count(self._mpi.BYTE))
        with self._bulk(timeout, "data receive"):
            self.comm.Recv([into[:size], self._mpi.BYTE], incoming.source, incoming.tag)
        return size

    # -- collectives of Python objects (set-up, a round's orders and reports) ---
    @surfacing_failures
    def allgather(self, obj: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order; the ranks meet first, so a missing one is named."""
        timeout = self._limit(timeout)
        self._rendezvous(0, timeout, "agreement of every rank")
        with self._bulk(timeout, "agreement of every rank"):
            return self.comm.allgather(obj)

    @surfacing_failures
    def bcast_object(self, obj: Any = None, root: int = 0, timeout: float | None = None) -> Any:
        """``obj`` from ``root`` on every rank (the job's plan, a round's order)."""
        timeout = self._limit(timeout)
        if self.rank == root:
            self._count(len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)) * (self.size - 1))
        self._rendezvous(root, timeout, f"message broadcast by rank {root}")
        with self._bulk(timeout, f"message broadcast by rank {root}"):
            return self.comm.bcast(obj, root=root)

    def learn_hosts(self) -> list[str]:
        """Every rank's host, kept so that a later timeout names where a missing rank runs."""
        hosts: list[str] = self.allgather(self.host)
        self.accounting.hosts = hosts
        return hosts

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

    # -- failures ----------------------------------------------------------------
    def notify_failure(self, text: str) -> None:
        """Tell every other rank that this one failed with ``text`` and is leaving the job.

        The notice is small, so MPI sends it eagerly even to a peer that is busy or stopped;
        a peer that takes nothing within ``NOTICE_SECONDS`` is left behind.
        """
        data = pickle.dumps((self.rank, self.host, text[:NOTICE_CHARS]), protocol=pickle.HIGHEST_PROTOCOL)
        requests = [self.comm.Isend([data, self._mpi.BYTE], rank, TAG_FAILED)
                    for rank in range(self.size) if rank != self.rank]
        deadline = time.perf_counter() + NOTICE_SECONDS
        while not all(request.Test() for request in requests) and time.perf_counter() < deadline:
            time.sleep(1e-3)

    def check_notices(self) -> None:
        """Raise :class:`PeerFailure` when another rank's failure notice has arrived."""
        status = self._mpi.Status()
        if not self.comm.Iprobe(self._mpi.ANY_SOURCE, TAG_FAILED, status):
            return
        data = bytearray(status.Get_count(self._mpi.BYTE))
        self.comm.Recv([data, self._mpi.BYTE], status.Get_source(), TAG_FAILED)
        raise PeerFailure(*pickle.loads(data))

    def shrink(self, timeout: float | None = None) -> Shrunk:
        """Revoke the communicator (every survivor's pending and later calls on it fail, so all of them
        come here), then carry on with a new one of the survivors, renumbered in their old order.
        """
        old = self.comm
        try:
            old.Revoke()
        except self._mpi.Exception:
            pass  # revoked already, by the rank that noticed first
        # Blocking: a polled MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0. Past ``timeout``
        # (a survivor that never comes) the job ends, as for any stuck transfer.
        with self._bulk(self._limit(timeout), "shrink of the communicator to the surviving ranks"):
            new = old.Shrink()
        new.Set_errhandler(self._mpi.ERRORS_RETURN)  # failures stay exceptions on the new communicator
        survivors = self._mpi.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())), old.Get_group())
        self.comm = new
        self._slots = None  # the window was the old communicator's; a survivor meets through MPI
        return self.accounting.renumber(list(survivors))

    @surfacing_failures
    def agree(self, flag: int) -> int:
        """ULFM's fault-tolerant agreement: the bitwise AND of every live rank's ``flag``; RankLost
        when a rank of the communicator failed (shrink again, then agree again)."""
        return int(self.comm.Agree(flag))

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

    def split_workers(self) -> Transport | None:
        """The workers' own communicator (every rank but 0, in order), for what they exchange among themselves
        at every step; rank 0 gets None. Every rank calls it."""
        color = self._mpi.UNDEFINED if self.rank == 0 else 1
        comm = self.comm.Split(color, key=self.rank)
        if self.rank == 0:
            return None
        workers = Transport(comm, self.max_sleep)
        workers.bound, workers.phase = self.bound, self.phase
        workers.hosts = None if self.hosts is None else self.hosts[1:]
        return workers

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def in_place(buf: np.ndarray, verb: str) -> np.ndarray:
    """``buf`` as one flat view, which a collective's result is written into; a buffer that is not contiguous
    has no such view (a flat copy would take the result instead of it), so it is refused."""
    if not buf.flags.c_contiguous:
        raise ValueError(f"{verb} writes its result into the buffer it is given, which must be one contiguous "
                         f"array. Received: an array of shape {buf.shape} with strides {buf.strides}; pass "
                         f"np.ascontiguousarray(...) and read the result from it")
    return buf.reshape(-1)


if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport

    def _speaks_every_verb(transport: Transport) -> RankTransport:
        return transport  # the type checker holds Transport to the protocol the links speak
