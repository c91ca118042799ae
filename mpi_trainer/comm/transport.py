"""The only module that talks MPI.

The scheduler and the workers speak through a handful of verbs on
:class:`Transport`: small pickled messages between two ranks, flat float32
buffers broadcast, reduced or sent point to point, and a few set-up
collectives. Every verb counts the bytes its rank sends.

Waiting and moving are kept apart. A rank blocked in a plain MPI call spins a
CPU core that the workers need for training, so every *wait for a peer* is a
non-blocking request polled with short, growing sleeps, and it can time out.
But Open MPI advances a transfer only inside MPI calls: a bulk transfer polled
with sleeps stalls between the polls (a 1.85 MB ``MPI_Ireduce`` took 1.1 s
where a blocking ``MPI_Reduce`` took 0.4 ms). So bulk payloads move only once
every participant is known to be there, and then with the blocking call:

* collectives (``broadcast``, ``reduce_sum``): each rank sends the root an
  empty "arrived" message and sleeps until the root answers "proceed", which
  it does once all have arrived; each confirms with "going", and every rank
  calls the blocking collective (the root once all have confirmed);
* point to point, from ``announce_bytes`` on: the sender sends an empty
  announcement on the payload's tag and sleeps until the receiver answers
  "clear"; then the sender's blocking send meets the receiver's blocking receive.

These small messages have their own tags (or are empty on the payload's tag,
which no payload is) and carry no bytes, so they are neither confused with
other messages nor counted as traffic.

Every wait is bounded. A verb called without a ``timeout`` waits at most
``bound`` seconds (the job sets it: a floor during set-up, then what the rounds
measure), and the timeout names this rank's ``phase`` and the missing ranks
and their hosts. The set-up collectives (``allgather``, ``bcast_object``,
``barrier``) meet like the bulk ones: a sleeping rendezvous, then the blocking
call. A rank that fails in a way it can report (an exception, not a stop) sends
every other rank a *failure notice* (``notify_failure``); a rank notices it at
its next wait and raises :class:`PeerFailure`, so nobody waits for orders from
a rank that has left.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpi_trainer.errors import EXIT_WORKER_FAILURE, RankLost, WorkerFailure

# The transport's own hand-shake tags. Message tags belong to mpi_trainer.comm.protocol, which keeps
# below FIRST_TRANSPORT_TAG; the transport's verbs take the caller's tag.
FIRST_TRANSPORT_TAG = 17
TAG_ARRIVED = 17  # collective readiness: a rank reached the collective (to the root)
TAG_PROCEED = 18  # collective readiness: every rank arrived (from the root)
TAG_CLEAR = 19  # point to point: the receiver is ready for an announced payload
TAG_GOING = 20  # collective readiness: a rank got "proceed" and enters the collective (to the root)
TAG_FAILED = 21  # a failure notice: the sender failed and left the job (pickled rank, host, text)

# A failure notice carries at most this many characters of the error (it must stay an eager message).
NOTICE_CHARS = 2000
# Seconds a failing rank spends handing its notices to MPI before it gives up on a peer that takes none.
NOTICE_SECONDS = 5.0

# A blocking transfer held up past the watchdog's timeout ends the job with the
# watchdog's exit status (mpi_trainer.errors.EXIT_WORKER_FAILURE).
STUCK_TRANSFER_EXIT = EXIT_WORKER_FAILURE

# MPI counts are C ints: one message carries fewer than 2**31 elements, so data
# arrays travel as byte chunks of at most 1 GiB.
MAX_MESSAGE_BYTES = 1 << 30

# Point-to-point payloads from this size on are announced and sent once the
# receiver is ready. Below it Open MPI sends eagerly (its TCP eager limit is
# 64 KiB), and the handshake's two extra messages would cost more than they save.
ANNOUNCE_BYTES = 32 * 1024

# Polling back-off: for the first 200 us a wait polls without pausing (a sleep
# lasts at least ~60 us on Linux, longer than a readiness message takes, and
# yielding the core to a busy neighbour costs its whole time slice); then each
# sleep is a tenth of the time waited so far, from 20 us up to ``max_sleep``. A
# peer that arrives is noticed at most 10 % late, while a long wait wakes only
# every ``max_sleep`` (about 1 % of a core).
_SPIN_SECONDS = 2e-4
_FIRST_SLEEP = 2e-5
_SLEEP_FRACTION = 0.1
DEFAULT_MAX_SLEEP = 0.005

# Waits for a message whose arrival time is known (a worker's report at k steps per round,
# expected when the last round's came): from shortly before it is due until a little after, the
# wait polls every ``_DUE_SLEEP`` instead of following the back-off, whose sleeps have grown to
# ``max_sleep`` by then and would notice the message up to that late. The window is a
# fraction of the wait, capped in seconds, so a long round spends at most ~12 ms polling finely.
_DUE_LEAD_FRACTION, _DUE_LEAD = 0.05, 2e-3
_DUE_GRACE_FRACTION, _DUE_GRACE = 0.25, 1e-2
_DUE_SLEEP = 5e-5

_NOTHING = np.empty(0, np.uint8)  # the payload of the readiness messages


@dataclass
class Received:
    """A message taken off the wire: its payload, sender and size in bytes."""

    payload: Any
    source: int
    nbytes: int


def poll_sleep(waited: float, max_sleep: float) -> float:
    """The next sleep of a wait that has lasted ``waited`` seconds (0: poll again at once)."""
    if waited < _SPIN_SECONDS:
        return 0.0
    return min(max(_FIRST_SLEEP, waited * _SLEEP_FRACTION), max(max_sleep, _FIRST_SLEEP))


def due_sleep(pause: float, now: float, started: float, due: float) -> float:
    """``pause`` (the back-off's next sleep) shortened around ``due``, when a message is expected.

    Before the fine window opens, no sleep runs past its opening; inside it, sleeps are
    ``_DUE_SLEEP``; after it closes (the message is late), the back-off goes on unchanged.
    """
    span = max(due - started, 0.0)
    opens = due - min(_DUE_LEAD_FRACTION * span, _DUE_LEAD)
    closes = due + min(_DUE_GRACE_FRACTION * span, _DUE_GRACE)
    if now < opens:
        return min(pause, opens - now)
    return min(pause, _DUE_SLEEP) if now < closes else pause


@dataclass
class Shrunk:
    """What a shrink left: ``survivors`` are the previous ranks in their new order (new rank = index),
    ``lost`` the previous ranks that failed, ``lost_world`` those ranks' ``MPI_COMM_WORLD`` ranks."""

    survivors: list[int]
    lost: list[int]
    lost_world: list[int]


class TransportTimeout(TimeoutError):
    """A wait for peers ran out of time; ``missing`` names the ranks that never arrived."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing


class PeerFailure(WorkerFailure):
    """Another rank failed and said so (a failure notice); ``rank`` is the rank that failed."""

    def __init__(self, rank: int, host: str, text: str) -> None:
        role = "the scheduler" if rank == 0 else "worker"
        super().__init__(f"rank {rank} ({role}) on host {host} failed: {text}")
        self.rank = rank


def notice_text(exc: BaseException) -> str:
    """What a failure notice says about ``exc``: its type and message, cut to ``NOTICE_CHARS``."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= NOTICE_CHARS else text[:NOTICE_CHARS - 3] + "..."


class StuckGuard:
    """One sleeping thread per transport that ends the job when a blocking transfer outlives its bound.

    Arming and disarming only set an attribute, so a transfer costs no thread start (a timer per
    call did, a millisecond and more on a loaded machine); the thread wakes every ``tick`` seconds.
    """

    def __init__(self, on_stuck: Callable[[str, float], None], tick: float = 0.25) -> None:
        self.on_stuck, self.tick = on_stuck, tick
        self.armed: tuple[float, str, float] | None = None  # (deadline, what, timeout)
        threading.Thread(target=self._watch, name="mpi_trainer-stuck-guard", daemon=True).start()

    def arm(self, timeout: float, what: str) -> None:
        self.armed = (time.perf_counter() + timeout, what, timeout)

    def disarm(self) -> None:
        self.armed = None

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick)
            armed = self.armed
            if armed is not None and time.perf_counter() > armed[0]:
                self.on_stuck(armed[1], armed[2])
                return


class RankAccounting:
    """What every transport keeps for its rank: who it is, the bytes it sent, the time it waited.

    Shared by :class:`Transport` and the in-process
    :class:`~mpi_trainer.comm.local.LocalTransport`, so both count alike.
    """

    def _start_accounting(self, rank: int, size: int, host: str) -> None:
        self.rank, self.size, self.host = rank, size, host
        self.world_rank = rank  # this rank's number when the job started; a shrink renumbers ``rank`` only
        self.world_ranks = list(range(size))  # the starting rank of each current rank
        # Seconds a wait without a timeout of its own may last (None: for ever; a job sets it), what
        # this rank is doing (named when a wait runs out), and every rank's host once learned.
        self.bound: float | None = None
        self.phase = "set-up"
        self.hosts: list[str] | None = None
        self.bytes_sent = 0
        self.total_bytes_sent = 0
        self.wait_wall_seconds = 0.0
        self.wait_cpu_seconds = 0.0

    @property
    def workers(self) -> int:
        return self.size - 1

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} on {self.host}"

    def _limit(self, timeout: float | None) -> float | None:
        """A verb's own ``timeout``, else the transport's ``bound``."""
        return self.bound if timeout is None else timeout

    def name_ranks(self, ranks: list[int]) -> str:
        """``rank 2 on host node-b, rank 3 on ...`` (the hosts once every rank's is known)."""
        if not self.hosts:
            return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        return ", ".join(f"rank {rank} on host {self.hosts[rank]}" for rank in ranks)

    def _count(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.total_bytes_sent += nbytes

    def take_bytes(self) -> int:
        """Bytes this rank sent since the previous call."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def _renumber(self, survivors: list[int]) -> Shrunk:
        """After a shrink: this rank's new number, and who was lost (as previous and starting ranks)."""
        lost = sorted(set(range(self.size)) - set(survivors))
        shrunk = Shrunk(survivors, lost, [self.world_ranks[rank] for rank in lost])
        self.world_ranks = [self.world_ranks[rank] for rank in survivors]
        self.rank, self.size = self.world_ranks.index(self.world_rank), len(survivors)
        if self.hosts:
            self.hosts = [self.hosts[rank] for rank in survivors]
        return shrunk


# MPI error classes that say a peer failed (ULFM): the verbs raise RankLost for them.
_FAILURE_CLASSES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


def _surfacing_failures(verb: Callable[..., Any]) -> Callable[..., Any]:
    """A verb that raises :class:`RankLost` where MPI reports a failed peer or a revoked communicator."""

    @functools.wraps(verb)
    def wrapper(self: Transport, *args: Any, **kwargs: Any) -> Any:
        try:
            return verb(self, *args, **kwargs)
        except self._mpi.Exception as exc:
            if exc.Get_error_class() not in self._failure_classes:
                raise
            raise RankLost(f"{self.describe()}: {exc.Get_error_string()}") from exc

    return wrapper


def fault_tolerance_problem(environ: dict[str, str] | None = None) -> str | None:
    """What stops this job from surviving a lost rank (``fault.survive``), or None when nothing does.

    The MPI library must have ULFM (Open MPI 5), and ``mpirun`` must have started the job with it on
    (``--with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``) over a transport that reports a lost
    peer: the ob1 messaging layer over TCP (``--mca pml ob1 --mca btl tcp,self``). Over the default
    shared-memory transport a collective with a lost peer hangs instead of failing.
    """
    from mpi4py import MPI

    environ = dict(os.environ if environ is None else environ)
    library = MPI.Get_library_version().splitlines()[0].strip()
    version = re.match(r"Open MPI v(\d+)", library)
    if not hasattr(MPI.Comm, "Shrink") or version is None or int(version.group(1)) < 5:
        return f"the MPI library has no fault-tolerant MPI (ULFM); it needs Open MPI 5 or later. Received: {library}"
    if environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes", "enabled"):
        return "the job was started without fault-tolerant MPI. Received: no `--with-ft ulfm` on the mpirun line"
    btl, pml = environ.get("OMPI_MCA_btl", ""), environ.get("OMPI_MCA_pml", "")
    if pml != "ob1" or not btl or btl.startswith("^") or {"sm", "vader"} & set(btl.split(",")):
        return (f"the job's transport does not report a lost rank (shared memory hangs instead). Received: "
                f"--mca pml {pml or '(default)'} --mca btl {btl or '(default)'}; expected --mca pml ob1 "
                f"--mca btl tcp,self")
    return None


class Transport(RankAccounting):
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
        self._failure_classes = {getattr(MPI, name) for name in _FAILURE_CLASSES if hasattr(MPI, name)}
        self._guard: StuckGuard | None = None

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Add the wall and CPU time of the block to this rank's time in the transport."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wait_wall_seconds += time.perf_counter() - wall0
            self.wait_cpu_seconds += time.process_time() - cpu0

    @contextmanager
    def _bulk(self, timeout: float | None, what: str) -> Iterator[None]:
        """Time a blocking transfer that every peer has entered; past ``timeout``, end the job.

        A blocking MPI call cannot time out, and a peer stopped inside it would
        hold this rank for ever, so the transport's :class:`StuckGuard` names the
        transfer and aborts.
        """
        armed = timeout is not None and self._guard_ready()
        if armed:
            self._guard.arm(timeout, what)
        try:
            with self._timed():
                yield
        finally:
            if armed:
                self._guard.disarm()

    def _guard_ready(self) -> bool:
        """Whether a guard thread can watch this rank's blocking calls (MPI must allow threads)."""
        if self._guard is None and self._mpi.Query_thread() >= self._mpi.THREAD_MULTIPLE:
            self._guard = StuckGuard(self._abort_stuck)
        return self._guard is not None

    def _abort_stuck(self, what: str, timeout: float) -> None:
        sys.stderr.write(f"mpi_trainer: error: {self.describe()}: the {what} did not complete within "
                         f"{timeout:g} s of every rank entering it (a peer stopped inside it); ending the job\n")
        sys.stderr.flush()
        self.abort(STUCK_TRANSFER_EXIT)

    # -- waiting ----------------------------------------------------------
    def _blocking(self, timeout: float | None) -> bool:
        return self.max_sleep <= 0 and timeout is None

    def _poll(self, ready: Callable[[], bool], timeout: float | None, what: str,
              missing: Callable[[], list[int]] = list, due: float | None = None) -> None:
        """Call ``ready()`` with growing sleeps until it is true; TransportTimeout after ``timeout``.

        ``due`` (a ``time.perf_counter()`` time): when the awaited message is expected; see
        :func:`due_sleep`.
        """
        with self._timed():
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
        named = f" (waiting for {self.name_ranks(missing)})" if missing else ""
        return TransportTimeout(f"{self.describe()}, {self.phase}: no {what} within {timeout:g} s{named}", missing)

    # -- failure notices ----------------------------------------------------
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

    def _wait(self, request: Any, what: str = "completion", timeout: float | None = None,
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
        request = self.comm.Irecv([_NOTHING, self._mpi.BYTE], peer, tag)
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

    def _probe(self, source: int, tag: int, timeout: float | None, due: float | None = None) -> Any:
        status = self._mpi.Status()
        what = f"message (tag {tag}) from {'any rank' if source < 0 else f'rank {source}'}"
        if self._blocking(timeout):
            with self._timed():
                self.comm.Probe(source, tag, status)
        else:
            self._poll(lambda: self.comm.Iprobe(source, tag, status), timeout, what,
                       lambda: [] if source < 0 else [source], due)
        return status

    # -- readiness ----------------------------------------------------------
    def _send_nothing(self, dest: int, tag: int) -> None:
        """An empty message: MPI sends it eagerly, so the request is complete when posted."""
        self.comm.Isend([_NOTHING, self._mpi.BYTE], dest, tag).Wait()

    def _gather_nothing(self, others: set[int], tag: int, timeout: float | None, what: str) -> None:
        """Root: sleep until every rank in ``others`` has sent it an empty message on ``tag``."""
        heard: set[int] = set()
        status = self._mpi.Status()

        def everyone() -> bool:
            while len(heard) < len(others) and self.comm.Iprobe(self._mpi.ANY_SOURCE, tag, status):
                self.comm.Recv([_NOTHING, self._mpi.BYTE], status.Get_source(), tag)
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

    def _accept(self, status: Any, tag: int, timeout: float | None) -> Any:
        """Receiver: take the announcement ``status`` describes, clear the sender, probe the payload.

        The payload follows within one of the sender's polling sleeps; the probe
        still sleeps and times out, for a sender stopped before it sent.
        """
        sender = status.Get_source()
        self.comm.Recv([_NOTHING, self._mpi.BYTE], sender, tag)
        self._send_nothing(sender, TAG_CLEAR)
        return self._probe(sender, tag, timeout)

    def _receive_status(self, source: int, tag: int, timeout: float | None, expected: int = -1,
                        due: float | None = None) -> Any:
        """The status of the next payload on ``tag``, after accepting an announcement if one comes first."""
        status = self._probe(source, tag, timeout, due)
        if status.Get_count(self._mpi.BYTE) == 0 and expected != 0:
            status = self._accept(status, tag, timeout)
        return status

    # -- small objects ----------------------------------------------------
    @_surfacing_failures
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

    @_surfacing_failures
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
    @_surfacing_failures
    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        """Broadcast ``buf`` in place from ``root`` to every rank."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights broadcast")
        with self._bulk(timeout, "weights broadcast"):
            self.comm.Bcast(buf, root=root)
        if self.rank == root:
            self._count(buf.nbytes * (self.size - 1))

    @_surfacing_failures
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

    @_surfacing_failures
    def gather(self, buf: np.ndarray, out: np.ndarray | None = None, root: int = 0,
               timeout: float | None = None) -> None:
        """Every rank's ``buf`` into row ``rank`` of ``out`` (shape ``(size, *buf.shape)``) at ``root``."""
        timeout = self._limit(timeout)
        self._rendezvous(root, timeout, "weights gather")
        with self._bulk(timeout, "weights gather"):
            self.comm.Gather(buf, out if self.rank == root else None, root=root)
        if self.rank != root:
            self._count(buf.nbytes)

    @_surfacing_failures
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

    @_surfacing_failures
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
    @_surfacing_failures
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

    @_surfacing_failures
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
    @_surfacing_failures
    def allgather(self, obj: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's ``obj``, in rank order; the ranks meet first, so a missing one is named."""
        timeout = self._limit(timeout)
        self._rendezvous(0, timeout, "set-up agreement")
        with self._bulk(timeout, "set-up agreement"):
            return self.comm.allgather(obj)

    @_surfacing_failures
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

    @_surfacing_failures
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

    # -- surviving a lost rank (ULFM) -------------------------------------------
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
        return self._renumber(list(survivors))

    @_surfacing_failures
    def agree(self, flag: int) -> int:
        """ULFM's fault-tolerant agreement: the bitwise AND of every live rank's ``flag``; RankLost
        when a rank of the communicator failed (shrink again, then agree again)."""
        return self.comm.Agree(flag)

    def crash(self) -> None:
        """Test hook: end this process at once, as ``kill -9`` would (no MPI_Finalize, no exit code)."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def install_abort_on_error(transport: Transport) -> None:
    """Make an uncaught exception on this rank end the whole job promptly.

    The traceback goes to stderr under a header naming the rank and host, then
    ``MPI_Abort`` takes every other rank down, so nothing is left waiting.
    The hook it replaces stays reachable as ``sys.excepthook.previous``.
    """
    previous = getattr(sys.excepthook, "previous", sys.excepthook)  # installed again: keep the user's

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"mpi_trainer: {transport.describe()} failed:\n{text}")
        sys.stderr.flush()
        sys.stdout.flush()
        transport.abort(1)

    hook.previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook
