"""The bounded-staleness (SSP) engine of the scheduler, used when ``aggregation.ssp > 0``.

Separation of concerns: :class:`StaleSynchronousEngine` decides when each worker gets
work and how its update is merged; once a round's updates are in, it scores the
global model and hands the finished round to the
:class:`~mpi_trainer.scheduler.recorder.RoundRecorder`, which records it, checks early
stopping and checkpoints, exactly as for a synchronous round. The
staleness clock and the merge rules are pure functions in
:mod:`mpi_trainer.algorithms.staleness`; the shares are
:func:`~mpi_trainer.algorithms.aggregation.contribution_scale`'s, as in
synchronous rounds.

Exchange: every update travels point to point. The scheduler sends a worker an
``UpdateOrder`` and the current global weights; the worker trains once on its
block and sends back its report and its weights. The scheduler takes whichever
update arrives first (a non-blocking probe polled with sleeps, so it does not
spin), merges it, and hands fresh work to every idle worker the staleness
clock admits. A round closes every ``W`` merged updates: then the global model
is evaluated, logged, checked for early stopping and checkpointed, exactly as a
synchronous round, which it is at ``s = 0``.

With ``data.rebalance`` every merged update's measured speed goes to the same
:class:`~mpi_trainer.algorithms.rebalance.Rebalancer` as between synchronous
rounds; a re-cut reaches each worker with its next ``UpdateOrder`` (and,
under scatter, the rows it lacks follow that order).

Under ``fault.survive`` a lost worker (:class:`~mpi_trainer.errors.RankLost`, met
while taking an update in or handing work out) leaves the survivors to carry on:
the job shrinks, the blocks are re-planned for them, and the updates they were
computing are dropped (each had started from a version the merges since have
moved past; none reaches the global model in part). The updates merged before
the loss stay, each whole; the survivors keep their clocks and get fresh work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.aggregation import BestWindow
from mpi_trainer.algorithms.rebalance import Rebalancer, measured
from mpi_trainer.algorithms.staleness import (
    StalenessClock,
    UpdateRecord,
    busy_seconds,
    idle_fraction,
    merge_delta,
    merge_share,
)
from mpi_trainer.comm.protocol import JobPlan, Report, SchedulerLink, UpdateOrder
from mpi_trainer.config import Config
from mpi_trainer.data.increment import round_samples
from mpi_trainer.data.placement import ScatterLedger
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import RankLost
from mpi_trainer.persistence.resume import ResumeState, trim_rounds
from mpi_trainer.persistence.run_files import UPDATE_FIELDS, UPDATES_NAME, RoundLog
from mpi_trainer.persistence.run_record import NO_CONTEXT, RunContext, StopReason
from mpi_trainer.scheduler.engine import Engine
from mpi_trainer.scheduler.round_row import ClosedRound


@dataclass
class InFlight:
    """An update handed to a worker and not yet merged."""

    clock: int
    base_version: int
    base: np.ndarray
    staleness: int
    dispatched: float
    sizes: list[int]  # every block's size when it was dispatched (the weighted share's denominator)


@dataclass
class Window:
    """The updates merged since the last round closed."""

    started: float
    reports: list[Report] = field(default_factory=list)
    records: list[UpdateRecord] = field(default_factory=list)
    busy: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    received_bytes: int = 0
    merge_seconds: float = 0.0
    comm_seconds: float = 0.0
    winner: int = -1
    leader: Report | None = None  # best: the leading update (its worker may have sent two in the window)


class StaleSynchronousEngine(Engine):
    merges_each_update = True  # each update is merged as it arrives: no round aggregate, no outer step

    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        super().__init__(link, cfg, dataset, model, plan, run_dir, hosts, resume, context)
        start = self.recorder.start_round
        # Resumed: clocks go on from the checkpoint's next round (the round a worker's data draw
        # follows), and update numbers from the updates kept for the rounds already recorded.
        self.clock = StalenessClock(self.workers, cfg.aggregation.ssp, start=start)
        kept = trim_rounds(run_dir / UPDATES_NAME, start - 1) if resume is not None else []
        self.version = len(kept)
        self.in_flight: dict[int, InFlight] = {}
        self.dispatched = 0
        self.update_budget = (cfg.train.epochs - start) * len(self.workers)
        self.best = BestWindow()
        self.window = Window(self.recorder.started)
        self.update_log = RoundLog(run_dir / UPDATES_NAME, UPDATE_FIELDS)
        self.rebalancer = Rebalancer(plan.block_bounds, cfg.data.rebalance_smoothing) if cfg.data.rebalance else None
        # Under scatter a re-cut moves rows: the ledger knows who holds what.
        # (fault.survive: a lost worker's rows go to the survivors.)
        self.ledger = (ScatterLedger(cfg, plan, self.workers)
                       if (cfg.data.rebalance or cfg.fault.survive) and cfg.data.scatters else None)
        self.told = {worker: list(plan.block_bounds) for worker in self.workers}  # the blocks each one trains on

    def describe(self) -> str:
        damping = " with staleness damping" if self.cfg.aggregation.staleness_damping else ""
        return (f"{len(self.workers)} workers, {self.cfg.aggregation.method} aggregation, SSP staleness bound "
                f"{self.cfg.aggregation.ssp}{damping}, model {self.cfg.model.name} ({self.codec.size} parameters)")

    def close(self) -> None:
        super().close()
        self.update_log.close()

    # -- the rounds -------------------------------------------------------------
    def run_rounds(self) -> StopReason:
        reason = self.run_windows()
        self.surviving(self.drain, int(self.rounds[-1]["round"]) + 1 if self.rounds else self.recorder.start_round)
        return reason

    def run_windows(self) -> StopReason:
        """Merge updates as they arrive; every ``W`` of them close a round."""
        round_index = self.recorder.start_round
        self.surviving(self.dispatch_ready, round_index)
        while round_index < self.cfg.train.epochs:
            # after a loss the window may already hold as many updates as there are workers left
            if len(self.window.records) < len(self.workers) and \
                    not self.surviving(partial(self.merge_next, round_index), round_index):
                continue
            full = len(self.window.records) >= len(self.workers)
            if full and self.cfg.aggregation.elects:
                self.elect()
            self.surviving(self.dispatch_ready, round_index)  # before evaluating, so workers do not wait on it
            if full:
                reason = self.close_round(round_index)
                if reason:
                    return reason
                round_index += 1
        return StopReason.EPOCHS

    # -- surviving a lost worker (fault.survive) -------------------------------
    def surviving(self, step: Callable[[], None], round_index: int) -> bool:
        """Run ``step``; False when a worker was lost in it and the survivors carry on without it."""
        try:
            step()
            return True
        except RankLost as error:
            self.in_flight.clear()  # the survivors drop the updates they were computing
            self.recorder.count_bytes(self.link.take_bytes())
            self.survive_loss(error, round_index, f"round {round_index}")
            self.told = {}  # every next order carries the re-planned blocks
            self.update_budget = self.dispatched + (self.cfg.train.epochs - round_index) * len(self.workers)
            self.log.warning("round %d: the updates under way were dropped; %d workers carry on", round_index,
                             len(self.workers))
            self.surviving(self.dispatch_ready, round_index)
            return False

    def renumber(self, survivors: list[int]) -> None:
        """Clocks, busy spans and held rows follow the survivors' new numbers (index in ``survivors``)."""
        clocks = self.clock.clocks
        self.clock = StalenessClock(range(1, len(survivors)), self.cfg.aggregation.ssp)
        self.clock.clocks = {new: clocks[old] for new, old in enumerate(survivors) if new}
        self.window.busy = {new: self.window.busy[old] for new, old in enumerate(survivors)
                            if new and old in self.window.busy}
        if self.ledger is not None:
            self.ledger.held = {new: self.ledger.held[old] for new, old in enumerate(survivors) if new}

    # -- handing out work ---------------------------------------------------
    def dispatch_ready(self) -> None:
        for worker in self.workers:
            if worker not in self.in_flight and self.dispatched < self.update_budget \
                    and self.clock.may_start(worker):
                self.dispatch(worker)

    def dispatch(self, worker: int) -> None:
        clock = self.clock.clocks[worker]
        order, moved = self.update_order(worker, clock)
        self.send_order(worker, order)
        started = time.perf_counter()
        if moved is not None:
            self.hand_over_rows(worker, moved, clock)
        sent = self.wire.encode(self.weights)
        try:
            self.link.send_weights(worker, sent, self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure(f"take the weights of its update at clock {clock}", [worker]) from None
        self.window.comm_seconds += time.perf_counter() - started
        # The worker starts from the weights as they arrive: its delta is taken against the same.
        self.in_flight[worker] = InFlight(clock, self.version, self.wire.decode(sent), self.clock.lead(worker),
                                          time.perf_counter(), [end - start for start, end in self.plan.block_bounds])
        self.dispatched += 1

    def update_order(self, worker: int, clock: int) -> tuple[UpdateOrder, np.ndarray | None]:
        """The worker's UpdateOrder and, under scatter after a re-cut, the rows that follow it.

        A re-cut reaches each worker with its next update (the one it is computing
        keeps its old block), so between a re-cut and the slower worker's next
        update two blocks can overlap or leave rows out for that one update.
        """
        rate = self.recorder.callback_rate
        if self.told.get(worker) == self.plan.block_bounds:
            return UpdateOrder(clock, learning_rate=rate), None
        blocks = self.told[worker] = list(self.plan.block_bounds)
        if self.ledger is None:
            return UpdateOrder(clock, blocks, learning_rate=rate), None
        moved = self.ledger.hand_over(self.plan, worker, clock)
        return UpdateOrder(clock, blocks, len(moved), rate), moved

    # -- taking updates in --------------------------------------------------
    def receive_update(self) -> tuple[Report, np.ndarray, int]:
        """The first update to arrive from any worker: its report, weights and bytes."""
        try:
            message = self.link.recv_report(self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure("return an update", sorted(self.in_flight)) from None
        started = time.perf_counter()
        try:
            weights = self.link.recv_weights(message.source, self.wire.empty(self.codec.size), self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure("send the weights of its update", [message.source]) from None
        self.window.comm_seconds += time.perf_counter() - started
        return message.payload, self.wire.decode(weights.payload), message.nbytes + weights.nbytes

    def merge_next(self, round_index: int) -> None:
        report, local, nbytes = self.receive_update()
        arrived = time.perf_counter()
        flight = self.in_flight.pop(report.rank)
        self.observers.worker_phases([report])
        self.clock.finish(report.rank)
        share = self.merge(report, local, flight)
        self.version += 1
        self.rebalance(report)
        record = UpdateRecord(report.rank, flight.clock, flight.base_version, self.version, flight.staleness,
                              self.version - 1 - flight.base_version, share, report.samples,
                              report.train_seconds, round_index)
        self.window.reports.append(report)
        self.window.records.append(record)
        self.window.busy.setdefault(report.rank, []).append((arrived - report.train_seconds, arrived))
        self.window.received_bytes += nbytes
        self.window.merge_seconds += time.perf_counter() - arrived
        self.log_update(record, report)

    def merge(self, report: Report, local: np.ndarray, flight: InFlight) -> float:
        """Fold one update into the global model; returns the share it got (NaN for ``best``)."""
        if self.cfg.aggregation.elects:
            if self.best.offer(report.rank, report.val_accuracy, report.val_loss, local):
                self.window.leader = report
            return float("nan")
        round_total = round_samples(self.plan.num_train, flight.sizes, flight.clock, self.cfg.data.increment)
        share = merge_share(self.cfg.aggregation.method, report.samples, round_total, len(self.workers),
                            flight.staleness, self.cfg.aggregation.staleness_damping)
        merge_delta(self.weights, local, flight.base, share)
        self.weights_version += 1  # changed in place: the model no longer holds them once scored
        return share

    def rebalance(self, report: Report) -> None:
        """Re-cut the blocks from this update's measured speed; each worker takes them with its next order."""
        if self.rebalancer is None or not self.rebalancer.update({report.rank - 1: measured(report)}):
            return
        self.adopt_bounds(self.version)
        self.log.info("after update %d blocks re-cut by throughput %s", self.version - 1,
                      self.rebalancer.describe(self.workers))

    def elect(self) -> None:
        winner, weights = self.best.close()
        assert weights is not None, "a full window holds at least one offered update"
        self.weights = weights
        self.window.winner = winner
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in self.window.reports)
        self.log.info("window election: %s -> rank %d", scores, winner)

    def log_update(self, record: UpdateRecord, report: Report) -> None:
        # val_* are the worker's own scores on the validation split, sent only for ``best`` (NaN otherwise).
        row = {**asdict(record), "update": record.version - 1, "train_loss": report.train_loss,
               "val_loss": report.val_loss, "val_accuracy": report.val_accuracy,
               "elapsed_seconds": time.perf_counter() - self.recorder.started}
        self.update_log.write(row)
        self.log.debug("update %d from rank %d: clock %d, started from version %d, staleness %d, "
                       "%d versions behind, share %.4g", record.version - 1, record.worker, record.clock,
                       record.base_version, record.staleness, record.versions_behind, record.share)

    # -- rounds -------------------------------------------------------------
    def close_round(self, round_index: int) -> StopReason | None:
        """The round made of the last ``W`` updates goes to the recorder; returns a stop reason or None."""
        window = self.window
        reports = sorted(window.reports, key=lambda r: (r.rank, r.round))
        closed = ClosedRound(round_index, reports, self.link.take_bytes() + window.received_bytes,
                             window.merge_seconds, window.winner, window.leader,
                             max(record.staleness for record in window.records))
        cause = self.non_finite_cause(reports, self.weights)
        if cause:
            outcome, _ = self.apply_nan_policy(round_index, cause, self.weights, closed.bytes)
            # no SSP round is trained again (train.nan_policy = 'rollback' needs ssp = 0): the run ends
            return outcome if isinstance(outcome, StopReason) else StopReason.NAN
        self.state.steps += sum(r.steps for r in reports)
        finished = self.score(closed)
        finished.row.update(self.timing(window, time.perf_counter()))
        stop = self.record(finished)
        self.pace(round_index)
        self.window = Window(time.perf_counter())
        return stop

    def timing(self, window: Window, ended: float) -> dict[str, Any]:
        """The round's wall, communication and idle columns, once its evaluation ended at ``ended``."""
        return {"wall_seconds": ended - window.started, "comm_seconds": window.comm_seconds,
                "idle_fraction": idle_fraction(ended - window.started, self.busy_in(window, ended)),
                "block_sizes": ";".join(str(end - start) for start, end in self.plan.block_bounds)}

    def busy_in(self, window: Window, ended: float) -> dict[int, float]:
        """Each worker's busy time in the window: merged updates, plus the one it is computing now."""
        busy = {}
        for worker in self.workers:
            spans = list(window.busy.get(worker, []))
            if worker in self.in_flight:
                spans.append((self.in_flight[worker].dispatched, ended))
            busy[worker] = busy_seconds(spans, window.started, ended)
        return busy

    # -- the end ------------------------------------------------------------
    def drain(self) -> None:
        """Take in (and drop) the updates still being computed, so that no worker is left sending."""
        for _ in range(len(self.in_flight)):
            report, _, nbytes = self.receive_update()
            self.in_flight.pop(report.rank)
            self.recorder.count_bytes(nbytes)
        self.recorder.count_bytes(self.link.take_bytes())
