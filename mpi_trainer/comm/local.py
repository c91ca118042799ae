"""A naive transport: every rank in one process, one thread each, no MPI.

It speaks the same verbs as :class:`~mpi_trainer.comm.transport.Transport`
(point-to-point messages with tags, broadcast, sum-reduction, set-up
collectives), so the scheduler's and the workers' rounds run unchanged
on it. That is what makes them testable in one process: a test starts the
scheduler and its workers as threads of a :class:`LocalWorld` and reads the
run directory afterwards. Payloads are copied (objects pickled, arrays
copied), as they would be on a wire, and bytes are counted the same way.

When a rank fails, :meth:`LocalTransport.abort` wakes every waiting rank with
:class:`RankAborted`, so a failure in one thread never leaves the others
hanging; a wait with a timeout raises ``TimeoutError`` as MPI waits do, and a
wait without one lasts at most the transport's ``bound``. A failure notice
(:meth:`LocalTransport.notify_failure`) wakes the other ranks' waits with
:class:`~mpi_trainer.errors.PeerFailure`, as over MPI.

A rank can also be lost as under ``fault.survive`` (:meth:`LocalTransport.leave_world`, the test hook
of a ``kill -9``): from then on every other rank's waits raise
:class:`~mpi_trainer.errors.RankLost`, as MPI's do once the communicator is revoked, until
the survivors :meth:`~LocalTransport.shrink` to a world without it, renumbered in their old order.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from mpi_trainer.comm.accounting import AccountedRank, IncomingArray, RankAccounting, Received, Shrunk
from mpi_trainer.errors import PeerFailure, RankLost

_ANY = -1
T = TypeVar("T")


class RankAborted(RuntimeError):
    """Another rank of the local world failed; this one stops waiting."""


class RankDied(Exception):
    """Ends the thread of a rank that :meth:`LocalTransport.leave_world` took out of the world."""


@dataclass
class _Message:
    source: int
    tag: int
    payload: Any
    nbytes: int


@dataclass
class _Collective:
    """One collective call, matched across ranks by its sequence number."""

    deposits: dict[int, Any] = field(default_factory=dict)


class LocalWorld:
    """``size`` ranks that talk through shared mailboxes under one condition variable."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a world needs at least one rank. Received: size={size}")
        self.size = size
        self.cond = threading.Condition()
        self.mailboxes: dict[int, list[_Message]] = {rank: [] for rank in range(size)}  # by starting rank
        self.collectives: dict[int, _Collective] = {}
        self.aborted: str | None = None
        # Fault tolerance: the starting ranks of the current world (index = rank now), the lost ones,
        # and those waiting to shrink; each shrink starts a new generation.
        self.members, self.previous = list(range(size)), list(range(size))
        self.lost: set[int] = set()
        self.shrinking: set[int] = set()
        self.generation = 0
        self.notices: dict[int, list[tuple[int, str, str]]] = {rank: [] for rank in range(size)}
        self.workers: LocalWorld | None = None  # every rank but 0, for what the workers exchange among themselves
        self._transports = [LocalTransport(self, rank) for rank in range(size)]

    def transports(self) -> list[LocalTransport]:
        return list(self._transports)

    def wait_for(self, ready: Callable[[], T | None], timeout: float | None, what: str, rank: int,
                 survivable: bool = True) -> T:
        """Block until ``ready()`` returns something truthy; call with ``cond`` held.

        ``survivable``: raise RankLost once a rank of the current world is lost (the shrink's own
        wait is not). A timeout names the rank's phase, as the MPI transport's does.
        """
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            if self.aborted is not None:
                raise RankAborted(f"rank {rank}: {self.aborted}")
            lost = sorted(self.lost & set(self.members))
            if survivable and lost:
                raise RankLost(f"rank {rank} of {self.size} on local: ranks {lost} (starting ranks) were lost")
            if self.notices[rank]:
                raise PeerFailure(*self.notices[rank].pop(0))
            result = ready()
            if result:
                return result
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                phase = self._transports[rank].phase if rank < len(self._transports) else "a shrunk world"
                raise TimeoutError(f"rank {rank} of {self.size} on local, {phase}: no {what} within {timeout:g} s")
            self.cond.wait(left)

    def run(self, roles: dict[int, Callable[[], Any]], timeout: float = 300.0) -> dict[int, Any]:
        """Run each rank's role in its own thread; returns their results, or raises the first failure.

        A role is a callable (e.g. a rank's whole fit) built on
        this world's transports (:meth:`transports`).
        """
        transports = self._transports
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}

        def play(rank: int) -> None:
            try:
                results[rank] = roles[rank]()
            except RankDied:
                results[rank] = None  # lost on purpose: the others carry on
            except BaseException as exc:  # noqa: BLE001 - reported to the caller below
                errors[rank] = exc
                transports[rank].abort()

        threads = [threading.Thread(target=play, args=(rank,), name=f"rank-{rank}") for rank in sorted(roles)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
        if any(thread.is_alive() for thread in threads):
            transports[0].abort()
            raise TimeoutError(f"the local world did not finish within {timeout:g} s")
        first = next((errors[r] for r in sorted(errors) if not isinstance(errors[r], RankAborted)), None)
        if first is not None or errors:
            raise first or next(iter(errors.values()))
        return results

    def try_shrink(self) -> None:
        """Start the next generation once every live rank of this one is shrinking; call with ``cond`` held.

        Messages and collectives in flight belong to the revoked world and go with it.
        """
        alive = [rank for rank in self.members if rank not in self.lost]
        if not set(alive) <= self.shrinking:
            return
        self.previous, self.members = self.members, alive
        self.shrinking = set()
        self.generation += 1
        for box in self.mailboxes.values():
            box.clear()
        self.collectives.clear()
        self.cond.notify_all()


class LocalTransport(AccountedRank):
    """One rank's end of a :class:`LocalWorld`, with :class:`~mpi_trainer.comm.transport.Transport`'s verbs."""

    def __init__(self, world: LocalWorld, rank: int) -> None:
        self.world = world
        self.accounting = RankAccounting(rank, world.size, "local")
        self.max_sleep = 0.0  # waits here wake on a condition; kept for the verbs' common settings
        self.bound: float | None = None  # seconds a wait without a timeout of its own may last (None: for ever)
        self.phase = "set-up"  # what this rank is doing, named when a wait runs out
        self._sequence = 0  # this rank's count of collective calls, to match them across ranks

    def _limit(self, timeout: float | None) -> float | None:
        """A verb's own ``timeout``, else the transport's ``bound``."""
        return self.bound if timeout is None else timeout

    # -- point to point ------------------------------------------------------
    def _post(self, dest: int, tag: int, payload: Any, nbytes: int) -> None:
        with self.world.cond:
            self.world.mailboxes[self.world.members[dest]].append(_Message(self.rank, tag, payload, nbytes))
            self.world.cond.notify_all()
        self.accounting.count(nbytes)

    def _take(self, source: int, tag: int, timeout: float | None) -> _Message:
        box = self.world.mailboxes[self.world_rank]

        def first_match() -> _Message | None:
            for index, message in enumerate(box):
                if message.tag == tag and source in (_ANY, message.source):
                    return box.pop(index)
            return None

        started = time.perf_counter()
        with self.world.cond:
            try:
                return self.world.wait_for(first_match, self._limit(timeout), f"message (tag {tag})", self.rank)
            finally:
                self.accounting.add_wait(time.perf_counter() - started)

    def send_object(self, obj: Any, dest: int, tag: int, timeout: float | None = None) -> int:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self._post(dest, tag, data, len(data))
        return len(data)

    def recv_object(self, source: int = _ANY, tag: int = 0, timeout: float | None = None,
                    due: float | None = None) -> Received:
        """``due`` is the MPI transport's polling hint; waits here wake on a condition, not by polling."""
        message = self._take(source, tag, timeout)
        return Received(pickle.loads(message.payload), message.source, message.nbytes)

    def send_array(self, buf: np.ndarray, dest: int, tag: int = 0, timeout: float | None = None) -> None:
        self._post(dest, tag, np.array(buf, copy=True), buf.nbytes)

    def recv_array(self, buf: np.ndarray, source: int = _ANY, tag: int = 0,
                   timeout: float | None = None) -> Received:
        message = self._take(source, tag, timeout)
        if message.nbytes != buf.nbytes:
            raise RuntimeError(f"expected {buf.nbytes} bytes of weights from rank {message.source}, "
                               f"received {message.nbytes}")
        buf[...] = message.payload.reshape(buf.shape)
        return Received(buf, message.source, message.nbytes)

    def send_large_array(self, array: np.ndarray, dest: int, tag: int = 0, timeout: float | None = None) -> None:
        self._post(dest, tag, np.array(array, copy=True), array.nbytes)

    def send_array_parts(self, parts: Iterable[np.ndarray], shape: tuple[int, ...], dtype: Any, dest: int,
                         tag: int = 0, timeout: float | None = None) -> None:
        array = np.concatenate([np.ravel(np.asarray(part, dtype=dtype)) for part in parts] or
                               [np.empty(0, dtype)])
        if array.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"the parts of an array of shape {tuple(shape)} held {array.size} elements")
        self._post(dest, tag, array.reshape(shape), array.nbytes)

    def recv_large_array(self, source: int, tag: int = 0, timeout: float | None = None) -> np.ndarray:
        array: np.ndarray = self._take(source, tag, timeout).payload
        return array

    def recv_large_array_header(self, source: int, tag: int = 0, timeout: float | None = None) -> IncomingArray:
        array = self.recv_large_array(source, tag, timeout)
        return IncomingArray(tuple(array.shape), array.dtype, source, tag, state=array)

    def recv_large_array_body(self, incoming: IncomingArray, take: Callable[[np.ndarray], None],
                              timeout: float | None = None) -> None:
        take(np.ravel(incoming.state))  # one message here: the array arrived whole

    # -- collectives ------------------------------------------------------------
    def _collective(self) -> _Collective:
        self._sequence += 1
        return self.world.collectives.setdefault(self._sequence, _Collective())

    def _gather_at(self, value: Any, timeout: float | None, what: str) -> dict[int, Any]:
        """Deposit ``value`` and wait until every rank has deposited its own; returns them all."""
        with self.world.cond:
            slot = self._collective()
            slot.deposits[self.rank] = value
            self.world.cond.notify_all()
            return self.world.wait_for(lambda: slot.deposits if len(slot.deposits) == self.size else None,
                                       self._limit(timeout), what, self.rank)

    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        with self.world.cond:
            slot = self._collective()
            if self.rank == root:
                slot.deposits[root] = np.array(buf, copy=True)
                self.world.cond.notify_all()
                self.accounting.count(buf.nbytes * (self.size - 1))
                return
            self.world.wait_for(lambda: slot.deposits.get(root) is not None, self._limit(timeout),
                                "weights broadcast", self.rank)
            buf[...] = slot.deposits[root]

    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                   on_part: Callable[[int, int], None] | None = None) -> None:
        self._sum(buf, root, timeout, on_part, True)

    def _sum(self, buf: np.ndarray, root: int, timeout: float | None, on_part: Callable[[int, int], None] | None,
             root_adds: bool) -> None:
        if self.rank != root:
            self.accounting.count(buf.nbytes)
        deposits = self._gather_at(np.array(buf, copy=True), timeout if self.rank == root else None,
                                   "weights reduction")
        if self.rank == root:
            added = [rank for rank in sorted(deposits) if root_adds or rank != root]  # rank order: the same sum
            buf[...] = sum((deposits[rank] for rank in added), np.zeros_like(buf))
            if on_part is not None:
                on_part(0, buf.size)

    def reduce_broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                         on_part: Callable[[int, int], None] | None = None, root_adds: bool = True,
                         on_returned: Callable[[int, int], None] | None = None) -> None:
        self._sum(buf, root, timeout, on_part, root_adds)
        self.broadcast(buf, root, timeout)
        if self.rank != root and on_returned is not None:
            on_returned(0, buf.size)

    def gather(self, buf: np.ndarray, out: np.ndarray | None = None, root: int = 0,
               timeout: float | None = None) -> None:
        if self.rank != root:
            self.accounting.count(buf.nbytes)
        deposits = self._gather_at(np.array(buf, copy=True), timeout if self.rank == root else None,
                                   "weights gather")
        if self.rank == root:
            if out is None:
                raise ValueError(f"the root of a gather needs a buffer for every rank's rows. Received: out=None "
                                 f"at rank {root}")
            out[...] = np.stack([deposits[rank] for rank in range(self.size)])

    def bcast_object(self, obj: Any = None, root: int = 0, timeout: float | None = None) -> Any:
        deposits = self._gather_at(pickle.dumps(obj) if self.rank == root else None, timeout,
                                   f"message broadcast by rank {root}")
        if self.rank == root:
            self.accounting.count(len(deposits[root]) * (self.size - 1))
        return pickle.loads(deposits[root])

    def allgather(self, obj: Any, timeout: float | None = None) -> list[Any]:
        deposits = self._gather_at(pickle.dumps(obj), timeout, "allgather")
        return [pickle.loads(deposits[rank]) for rank in range(self.size)]

    def learn_hosts(self) -> list[str]:
        hosts: list[str] = self.allgather(self.host)
        self.accounting.hosts = hosts
        return hosts

    def barrier(self, timeout: float | None = None) -> None:
        self._gather_at(True, timeout, "barrier")

    def duplicate(self, timeout: float | None = None) -> LocalTransport:
        """The same rank: a local world is made for one job."""
        return self

    def split_workers(self) -> LocalTransport | None:
        """The workers' own world (every rank but 0, in order); rank 0 gets None. Every rank calls it."""
        with self.world.cond:  # the first rank here makes the workers' world; every rank then finds it
            if self.world.workers is None:
                self.world.workers = LocalWorld(self.size - 1)
            made = self.world.workers
        self.barrier()
        if self.rank == 0:
            return None
        workers: LocalTransport = made.transports()[self.rank - 1]
        workers.bound = self.bound
        return workers

    # -- failure notices --------------------------------------------------------
    def notify_failure(self, text: str) -> None:
        """Wake every other rank's wait with :class:`PeerFailure` naming this rank's ``text``."""
        with self.world.cond:
            for rank in range(self.size):
                if rank != self.rank:
                    self.world.notices[rank].append((self.rank, self.host, text))
            self.world.cond.notify_all()

    def check_notices(self) -> None:
        with self.world.cond:
            if self.world.notices[self.rank]:
                raise PeerFailure(*self.world.notices[self.rank].pop(0))

    def node_layout(self) -> tuple[int, list[int]]:
        return 1, list(range(self.size))

    def abort(self, code: int = 1) -> None:
        with self.world.cond:
            self.world.aborted = self.world.aborted or f"rank {self.rank} aborted the job (code {code})"
            self.world.cond.notify_all()

    # -- fault tolerance ----------------------------------------------------------
    def leave_world(self) -> None:
        """Leave the world as a killed process would: the others' waits raise RankLost; this thread ends."""
        with self.world.cond:
            self.world.lost.add(self.world_rank)
            self.world.try_shrink()  # every other rank may be shrinking already
            self.world.cond.notify_all()
        raise RankDied(f"starting rank {self.world_rank} crashed on purpose")

    def shrink(self, timeout: float | None = None) -> Shrunk:
        """Wait for every live rank to shrink too, then carry on in the world of the survivors."""
        world = self.world
        with world.cond:
            generation = world.generation
            world.shrinking.add(self.world_rank)
            world.try_shrink()
            world.wait_for(lambda: world.generation != generation, timeout, "shrink", self.rank, survivable=False)
            survivors = [world.previous.index(rank) for rank in world.members]
        self._sequence = 0
        return self.accounting.renumber(survivors)

    def agree(self, flag: int) -> int:
        deposits = self._gather_at(int(flag), None, "agreement")
        result = -1
        for value in deposits.values():
            result &= value
        return result


if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport

    def _speaks_every_verb(transport: LocalTransport) -> RankTransport:
        return transport  # the type checker holds LocalTransport to the protocol the links speak
