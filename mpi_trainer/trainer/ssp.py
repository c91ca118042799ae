"""Stale synchronous parallel (``aggregation.ssp = s > 0``) for a script's own ``keras.Model``.

Each worker trains an epoch of its share whenever rank 0 hands it one, and rank 0 merges each
update as it arrives instead of waiting for every worker: a fast worker may run up to ``s``
epochs ahead of the slowest (:class:`~mpi_trainer.algorithms.staleness.StalenessClock`). An
update travels point to point: the order and the state it starts from to the worker, its report
and its state back. It is merged into the global state by meaning (:meth:`.state.ModelState.merge`:
the weights by the worker's change times its share, ``1/W`` or its rows' share, divided by
``1 + staleness`` with ``aggregation.staleness_damping``; moving averages by the worker's steps
applied to the global ones; step counts added). Every ``W`` merged updates close an epoch: rank 0
scores it, runs the callbacks and records it, as after a synchronous epoch, which it is at
``s = 0``. At the end the updates still under way are taken in and dropped, and every worker takes
the final state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpi_trainer.algorithms.staleness import StalenessClock, merge_share
from mpi_trainer.errors import Preempted
from mpi_trainer.trainer.round_protocol import Order, Report, non_finite_cause
from mpi_trainer.trainer.scheduler import SchedulerRounds
from mpi_trainer.trainer.worker import WorkerRounds

TAG_ORDER = 31  # rank 0 -> a worker: an Order (train an epoch from the state that follows, or stop)
TAG_STATE = 32  # rank 0 -> a worker: the state the order starts from
TAG_REPORT = 33  # a worker -> rank 0: its Report
TAG_UPDATE = 34  # a worker -> rank 0: its state after the epoch


@dataclass
class InFlight:
    """An update handed to a worker and not yet merged: the state it started from, and how far ahead of the
    slowest worker its author was then."""

    base: np.ndarray
    staleness: int


class StaleScheduler(SchedulerRounds):
    """Rank 0 under SSP: hands out epochs as the staleness bound admits, merges each update as it arrives."""

    def __init__(self, *args: Any, ssp: int, damping: bool, weighted: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ssp, self.damping, self.weighted = ssp, damping, weighted
        self.workers = list(range(1, self.transport.size))
        self.staleness = StalenessClock(self.workers, ssp)
        self.in_flight: dict[int, InFlight] = {}
        self.rows: dict[int, int] = {}  # each worker's rows in its last update (the weighted share's total)
        self.global_ = self.state.empty()  # the global state, merged into as updates arrive
        self.integers: list[np.ndarray] = []
        self.budget = self.dispatched = 0

    def run(self, initial_epoch: int, epochs: int) -> dict[str, float]:
        self.staleness = StalenessClock(self.workers, self.ssp, start=initial_epoch)
        self.state.read(self.global_)
        self.integers = self.state.read_integers()
        self.budget = (epochs - initial_epoch) * len(self.workers)  # updates, as many as synchronous epochs hold
        return super().run(initial_epoch, epochs)

    def train_epoch(self, epoch: int, times: dict[str, float]) -> list[Report]:
        """``W`` updates merged as they arrive, more handed out after each; the global state is then the model's."""
        self.clock.tick()
        self.dispatch_ready()
        reports: list[Report] = []
        while len(reports) < len(self.workers):
            reports.append(self.merge_next(times))
            self.dispatch_ready()
        cause = non_finite_cause(reports, self.global_)
        if cause:  # the fit stops with the state of the last epoch (train.nan_policy 'stop'; SSP never rolls back)
            self.record.log.error("epoch %d: %s; stopping, the model keeping the previous epoch's state", epoch, cause)
            self.stop_reason = "nan"
        else:
            self.state.write(self.global_)
            self.state.write_integers(self.integers)
        times["max_staleness"] = max(report.staleness for report in reports)
        return sorted(reports, key=lambda report: report.worker)

    def epoch_ended(self) -> None:
        """The callbacks' changes (a learning rate set) reach the updates handed out from here on."""
        self.state.read(self.global_)
        self.integers = self.state.read_integers()

    def dispatch_ready(self) -> None:
        for worker in self.workers:
            if worker not in self.in_flight and self.dispatched < self.budget and self.staleness.may_start(worker):
                self.dispatch(worker)

    def dispatch(self, worker: int) -> None:
        order = Order(self.staleness.clocks[worker], False, self.integers, seeds=self.seeds_to_send.pop(worker, None))
        self.transport.send_object(order, worker, TAG_ORDER)
        self.transport.send_large_array(self.global_, worker, TAG_STATE)
        self.in_flight[worker] = InFlight(self.global_.copy(), self.staleness.lead(worker))
        self.dispatched += 1

    def receive(self) -> tuple[Report, np.ndarray]:
        """The next update to arrive, from any worker: its report (``sent``: its bytes) and state."""
        waited = self.transport.accounting.name_ranks(sorted(self.in_flight))
        self.transport.phase = f"under SSP, waiting for the next update (in flight: {waited})"
        received = self.transport.recv_object(-1, TAG_REPORT)
        local = self.transport.recv_large_array(received.source, TAG_UPDATE)
        report: Report = received.payload
        report.worker, report.sent = received.source, received.nbytes + local.nbytes
        return report, local

    def merge_next(self, times: dict[str, float]) -> Report:
        started = time.perf_counter()
        report, local = self.receive()
        arrived = time.perf_counter()
        flight = self.in_flight.pop(report.worker)
        self.staleness.finish(report.worker)
        self.rows[report.worker] = report.rows
        total = sum(self.rows.get(worker, report.rows) for worker in self.workers)
        share = merge_share("weighted" if self.weighted else "average", report.rows, total, len(self.workers),
                            flight.staleness, self.damping) if report.batches else 0.0
        self.state.merge(self.global_, local, flight.base, share, report.steps)
        self.integers = self.state.combine_integers(self.integers, report.integers, np.asarray(report.steps))
        report.staleness = flight.staleness
        times["comm_seconds"] += arrived - started
        times["aggregate_seconds"] += time.perf_counter() - arrived
        return report

    def send(self, order: Order) -> None:
        """Only the end is sent to every worker: the updates under way are taken in and dropped, then each
        worker takes the order and the model's final state."""
        if not order.stop:
            raise RuntimeError(f"under SSP rank 0 hands out epochs one worker at a time. Received: {order}")
        while self.in_flight:
            report, _ = self.receive()
            self.in_flight.pop(report.worker)
            self.record.count_bytes(report.sent)
        self.state.read(self.global_)
        for worker in self.workers:
            self.transport.send_object(order, worker, TAG_ORDER)
            self.transport.send_large_array(self.global_, worker, TAG_STATE)


class StaleWorker(WorkerRounds):
    """A worker under SSP: takes an epoch's order and state from rank 0, trains, sends its report and state."""

    def serve(self) -> bool:
        self.transport.phase = self.awaiting_order()
        waiting = time.time()
        order: Order = self.transport.recv_object(0, TAG_ORDER).payload
        start = self.transport.recv_large_array(0, TAG_STATE)
        self.served, self.waited = order.epoch, (waiting, time.time())
        self.clock.tick()
        self.state.write(start)
        self.state.write_integers(order.integers)
        self.take_seeds(order)
        if order.stop and order.preempted:
            raise Preempted()
        if order.stop:
            return False
        self.test_hooks.freeze_at(self.transport.rank, order.epoch)  # debug.freeze_rank: this worker stops here
        self.maybe_crash(order.epoch, "train")
        began = self.state.optimizer_steps()
        report = self.train(order.epoch, *self.increment_share(order.epoch))
        report.steps = [report.batches] + [now - then for now, then in zip(self.state.optimizer_steps(), began)]
        report.preempt = self.preemption.requested
        self.transport.send_object(report, 0, TAG_REPORT)
        self.transport.send_large_array(self.state.read(start), 0, TAG_UPDATE)
        self.transport.take_bytes()  # rank 0 counts what it takes in
        return True
