"""What the scheduler and the workers say to each other, and in what order.

Separation of concerns: a transport (:mod:`~mpi_trainer.comm.transport` over MPI,
:mod:`~mpi_trainer.comm.local` in one process) moves bytes; this module owns the
conversation on top of it: the messages' tags and the order in which they
travel (the messages themselves are :mod:`~mpi_trainer.comm.messages`). The
engines and the worker call the verbs of :class:`SchedulerLink` and
:class:`WorkerLink` and never see a tag.

A synchronous round, as the scheduler sees it::

    send_order(RoundOrder) to every worker -> [send_rows, when a re-cut moved rows]
    -> [send_state, when resuming optimizer state] -> broadcast_weights
    -> recv_report (every worker)
    -> sum_weights (average, weighted) | request_weights(winner) (best)

Under ``evaluation.where = "workers"`` a scored round ends with
``send_order(EvaluateOrder)`` to every worker -> broadcast_weights
-> reduce_metric_state; the next RoundOrder then says ``held_weights`` and
its broadcast is left out (the workers hold the weights they just scored): each
worker sends "ready" instead (``await_ready``), so that the watchdog still
names a worker that stopped before the round. A broadcast's own arrival
messages do that when one follows.

An SSP update: ``send_order(UpdateOrder)``, [``send_rows`` after a re-cut under
scatter] and ``send_weights`` to one worker; its
``recv_report`` and ``recv_weights`` come back when it is done. At the end of
a run: ``send_order(SendOptimizerOrder)`` / ``recv_state`` for the checkpoint, then
``send_order(StopOrder)``. Reports always travel before weights, so a scheduler
that times out knows which rank is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from mpi_trainer.algorithms.wait_bounds import for_rank
from mpi_trainer.comm.accounting import IncomingArray, Received, Shrunk
from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.comm.messages import (
    EvaluateOrder,
    JobPlan,
    Order,
    Report,
    RoundOrder,
    Rows,
    SendOptimizerOrder,
    SendWeightsOrder,
    StopOrder,
    UpdateOrder,
)
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.errors import RankLost

# The messages are importable from here too, with the links that carry them.
__all__ = ["EvaluateOrder", "JobPlan", "MissingRanks", "Order", "Report", "RoundOrder", "Rows", "SchedulerLink",
           "SendOptimizerOrder", "SendWeightsOrder", "StopOrder", "UpdateOrder", "WorkerLink"]

# Below the transport's own hand-shake tags (handshakes.FIRST_TRANSPORT_TAG and up).
_TAG_ORDER = 11
_TAG_REPORT = 12
_TAG_WEIGHTS = 13
_TAG_DATA = 14
_TAG_STATE = 15
_TAG_READY = 16


class RowArrays(Protocol):
    """Training rows as the scheduler holds them to send (:class:`Rows`, or the data placement's own)."""

    positions: np.ndarray
    x: np.ndarray
    y: np.ndarray


class ArrayInParts(Protocol):
    """A flat array read part by part as it is sent (a checkpoint's array left on disk)."""

    @property
    def size(self) -> int: ...

    @property
    def dtype(self) -> np.dtype: ...

    def parts(self) -> Iterator[np.ndarray]: ...


class SchedulerLink:
    """Rank 0's side of the conversation. Waits take ``timeout`` (None: forever) and raise TimeoutError."""

    def __init__(self, transport: RankTransport) -> None:
        self.transport = transport

    @property
    def workers(self) -> list[int]:
        return list(range(1, self.transport.size))

    def take_bytes(self) -> int:
        return self.transport.take_bytes()

    def send_order(self, worker: int, order: Order) -> None:
        self.transport.send_object(replace(order, bound=self.transport.bound), worker, _TAG_ORDER)

    def await_ready(self, timeout_at: Callable[[], float | None]) -> None:
        """Every worker's "ready" for the round; ``timeout_at()`` gives the seconds left each time.

        Raises :class:`MissingRanks` naming the workers that did not answer.
        """
        ready: set[int] = set()
        while len(ready) < len(self.workers):
            try:
                ready.add(self.transport.recv_object(tag=_TAG_READY, timeout=timeout_at()).source)
            except TimeoutError:
                raise MissingRanks(sorted(set(self.workers) - ready)) from None

    def broadcast_weights(self, weights: np.ndarray, timeout: float | None) -> None:
        """``weights`` as they are (float32 for scoring, float64 for L-BFGS) to every worker."""
        self.transport.broadcast(weights, timeout=timeout)

    def broadcast_global(self, weights: np.ndarray, wire: WireFormat, timeout: float | None) -> None:
        """The global weights (float32) to every worker, carried in ``wire``'s dtype."""
        wire.broadcast_from_root(self.transport, weights, timeout=timeout)

    def recv_report(self, timeout: float | None, due: float | None = None) -> Received:
        """The next report from any worker (payload: :class:`Report`); ``due``: when it is expected
        (``time.perf_counter()``), so that the wait polls finely then instead of sleeping through it."""
        return self.transport.recv_object(tag=_TAG_REPORT, timeout=timeout, due=due)

    def sum_weights(self, wire: WireFormat, size: int, take: Callable[[int, np.ndarray], None],
                    timeout: float | None) -> None:
        """The sum of the workers' scaled weights (``size`` float32 values), however ``wire`` carries them, to
        ``take(start, values)`` part by part as each part is complete: no buffer of the whole sum."""
        wire.sum_parts_at_root(self.transport, size, take, timeout=timeout)

    def reduce_sum(self, out: np.ndarray, timeout: float | None) -> None:
        """The sum of the workers' vectors as they are (L-BFGS: float64 loss and gradient sums), into ``out``
        (zeros on entry)."""
        self.transport.reduce_sum(out, timeout=timeout)

    def reduce_metric_state(self, out: np.ndarray, timeout: float | None) -> None:
        """The sum of the workers' metric states (float64, zeros on entry), after an EvaluateOrder."""
        self.transport.reduce_sum(out, timeout=timeout)

    def request_weights(self, worker: int, out: np.ndarray, timeout: float | None) -> Received:
        """Best-of: the elected worker's candidate weights."""
        self.send_order(worker, SendWeightsOrder())
        return self.transport.recv_array(out, source=worker, tag=_TAG_WEIGHTS, timeout=timeout)

    def send_weights(self, worker: int, weights: np.ndarray, timeout: float | None = None) -> None:
        self.transport.send_array(weights, worker, _TAG_WEIGHTS, timeout=timeout)

    def recv_weights(self, worker: int, out: np.ndarray, timeout: float | None = None) -> Received:
        return self.transport.recv_array(out, source=worker, tag=_TAG_WEIGHTS, timeout=timeout)

    def send_state(self, worker: int, vector: np.ndarray | ArrayInParts) -> None:
        """A worker's optimizer state vector (a resume), as raw bytes: no pickled copy of it on either side;
        one left on disk goes part by part as it is read."""
        if isinstance(vector, np.ndarray):
            self.transport.send_large_array(vector, worker, _TAG_STATE)
        else:
            self.transport.send_array_parts(vector.parts(), (vector.size,), vector.dtype, worker, _TAG_STATE)

    def request_state(self, worker: int, timeout: float | None) -> IncomingArray:
        """Ask a worker for its optimizer state vector, for the checkpoint: its header (size and dtype);
        :meth:`receive_state` hands over the values."""
        self.send_order(worker, SendOptimizerOrder())
        return self.transport.recv_large_array_header(worker, _TAG_STATE, timeout=timeout)

    def receive_state(self, incoming: IncomingArray, take: Callable[[np.ndarray], None],
                      timeout: float | None) -> int:
        """The values of a state vector :meth:`request_state` announced, to ``take`` message by message;
        returns their bytes."""
        self.transport.recv_large_array_body(incoming, take, timeout=timeout)
        return int(np.prod(incoming.shape, dtype=np.int64)) * incoming.dtype.itemsize

    def send_rows(self, worker: int, rows: RowArrays, timeout: float | None = None) -> int:
        """Training rows (``positions``, ``x``, ``y``), in chunks below MPI's message limit; returns their bytes."""
        arrays = (rows.positions, rows.x, rows.y)
        for array in arrays:
            self.transport.send_large_array(array, worker, _TAG_DATA, timeout=timeout)
        return sum(array.nbytes for array in arrays)

    def send_split(self, worker: int, header: tuple[Any, ...], arrays: list[np.ndarray]) -> None:
        """Scatter at set-up: the dataset's description, then its arrays."""
        self.transport.send_object(header, worker, _TAG_DATA)
        for array in arrays:
            self.transport.send_large_array(array, worker, _TAG_DATA)

    def stop(self, preempted: bool = False) -> None:
        for worker in self.workers:
            try:
                self.send_order(worker, StopOrder(preempted=preempted))
            except RankLost:
                continue  # lost after the last round: it needs no stop, the others still do

    def shrink(self, timeout: float | None) -> Shrunk:
        """fault.survive: carry on with the surviving ranks (renumbered; see :class:`Shrunk`)."""
        return self.transport.shrink(timeout)

    def agree(self) -> None:
        """Every survivor holds the new communicator; RankLost if another rank failed meanwhile."""
        self.transport.agree(1)


class MissingRanks(TimeoutError):
    """Some ranks did not answer in time; ``missing`` names them (as the transport's timeouts do)."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"no answer from ranks {ranks}")
        self.missing = ranks


class WorkerLink:
    """A worker's side of the conversation. Its waits last ``WORKER_FACTOR`` times the scheduler's bound,
    which every order carries, so the scheduler names a missing worker before a worker names it."""

    def __init__(self, transport: RankTransport) -> None:
        self.transport = transport
        self.doing = "set-up"  # the last order's work, for the phase a timeout names

    @property
    def rank(self) -> int:
        return self.transport.rank

    @property
    def workers(self) -> int:
        return self.transport.size - 1

    def take_bytes(self) -> int:
        return self.transport.take_bytes()

    def recv_order(self) -> Order:
        self.transport.phase = f"waiting for the scheduler's next order (after {self.doing})"
        order: Order = self.transport.recv_object(0, _TAG_ORDER).payload
        if order.bound is not None:
            self.transport.bound = for_rank(self.rank, order.bound)
        self.doing = self.transport.phase = order.describe()
        return order

    @property
    def world_rank(self) -> int:
        """This worker's rank when the job started (a shrink renumbers :attr:`rank`)."""
        return self.transport.world_rank

    @property
    def scheduler_alive(self) -> bool:
        return self.transport.world_ranks[0] == 0

    def shrink(self) -> Shrunk:
        return self.transport.shrink()

    def agree(self) -> None:
        self.transport.agree(1)

    def crash(self) -> None:
        self.transport.crash()

    def send_ready(self, round_index: int) -> None:
        self.transport.send_object(round_index, 0, _TAG_READY)

    def recv_broadcast(self, out: np.ndarray) -> None:
        """What :meth:`SchedulerLink.broadcast_weights` sends, into ``out``."""
        self.transport.broadcast(out)

    def recv_global(self, out: np.ndarray, wire: WireFormat) -> None:
        """The global weights :meth:`SchedulerLink.broadcast_global` sends, decoded into ``out`` (float32)."""
        wire.broadcast_from_root(self.transport, out)

    def send_report(self, report: Report) -> None:
        self.transport.send_object(report, 0, _TAG_REPORT)

    def contribute_weights(self, scaled: np.ndarray, wire: WireFormat) -> None:
        """This worker's scaled weights (float32) into the scheduler's :meth:`SchedulerLink.sum_weights`."""
        wire.sum_to_root(self.transport, scaled)

    def contribute(self, values: np.ndarray) -> None:
        """This worker's vector as it is into the scheduler's :meth:`SchedulerLink.reduce_sum` (L-BFGS)."""
        self.transport.reduce_sum(values)

    def contribute_metric_state(self, state: np.ndarray) -> None:
        """This worker's metric state (float64) into the scheduler's sum."""
        self.transport.reduce_sum(state)

    def send_weights(self, weights: np.ndarray) -> None:
        self.transport.send_array(weights, 0, _TAG_WEIGHTS)

    def recv_weights(self, out: np.ndarray) -> None:
        self.transport.recv_array(out, source=0, tag=_TAG_WEIGHTS)

    def recv_state(self) -> np.ndarray:
        return self.transport.recv_large_array(0, _TAG_STATE)

    def send_state(self, parts: Iterable[np.ndarray], size: int) -> None:
        """This worker's optimizer state vector of ``size`` float32 values, sent part by part as ``parts``
        yields them (rank 0 receives the one vector)."""
        self.transport.send_array_parts(parts, (size,), np.float32, 0, _TAG_STATE)

    def recv_rows(self) -> Rows:
        return Rows(*(self.transport.recv_large_array(0, _TAG_DATA) for _ in range(3)))

    def recv_split(self, count: int) -> tuple[tuple[Any, ...], list[np.ndarray]]:
        header: tuple[Any, ...] = self.transport.recv_object(0, _TAG_DATA).payload
        return header, [self.transport.recv_large_array(0, _TAG_DATA) for _ in range(count)]
