"""The bounded-staleness (SSP) engine of the scheduler, used when ``aggregation.ssp > 0``.

Separation of concerns: :class:`SSPScheduler` only changes how updates are
exchanged and merged; evaluation, records, early stopping, checkpoints and the
end of the run are the synchronous :class:`~mpi_trainer.scheduler.Scheduler`'s.
The staleness clock and the merge rules are pure functions in
:mod:`mpi_trainer.ssp`.

Exchange: every update travels point to point. The scheduler sends a worker an
``UPDATE`` order and the current global weights; the worker trains once on its
block and sends back its report and its weights. The scheduler takes whichever
update arrives first (a non-blocking probe polled with sleeps, so it does not
spin), merges it, and hands fresh work to every idle worker the staleness
clock admits. A round closes every ``W`` merged updates: then the global model
is evaluated, logged, checked for early stopping and checkpointed, exactly as a
synchronous round, which it is at ``s = 0``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.comm import TAG_ORDER, TAG_REPORT, Transport
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.logs import RoundLog
from mpi_trainer.messages import UPDATE, JobPlan, Order, Report
from mpi_trainer.resume import ResumeState, trim_rounds
from mpi_trainer.scheduler import Scheduler
from mpi_trainer.ssp import (
    BestWindow,
    StalenessClock,
    UpdateRecord,
    busy_seconds,
    idle_fraction,
    merge_delta,
    merge_share,
)

UPDATES_NAME = "updates.csv"
UPDATE_FIELDS = ["update", "round", "worker", "clock", "base_version", "version", "staleness",
                 "versions_behind", "share", "samples", "train_seconds", "train_loss", "val_loss", "val_accuracy",
                 "elapsed_seconds"]


def scheduler_class(cfg: Config) -> type[Scheduler]:
    """The synchronous scheduler at ``ssp = 0``, the SSP engine otherwise (or when forced for checks)."""
    return SSPScheduler if cfg.aggregation.ssp > 0 or cfg.debug.async_engine else Scheduler


@dataclass
class InFlight:
    """An update handed to a worker and not yet merged."""

    clock: int
    base_version: int
    base: np.ndarray
    staleness: int
    dispatched: float


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


class SSPScheduler(Scheduler):
    def __init__(self, transport: Transport, cfg: Config, dataset: Dataset, model: Any,
                 plan: JobPlan, run_dir: Path, hosts: list[str] | None = None,
                 resume: ResumeState | None = None) -> None:
        super().__init__(transport, cfg, dataset, model, plan, run_dir, hosts, resume)
        # Resumed: clocks go on from the checkpoint's next round (the round a worker's data draw
        # follows), and update numbers from the updates kept for the rounds already recorded.
        self.clock = StalenessClock(self.workers, cfg.aggregation.ssp, start=self.start_round)
        kept = trim_rounds(run_dir / UPDATES_NAME, self.start_round - 1) if resume is not None else []
        self.version = len(kept)
        self.in_flight: dict[int, InFlight] = {}
        self.dispatched = 0
        self.update_budget = (cfg.train.epochs - self.start_round) * len(self.workers)
        self.best = BestWindow()
        self.window = Window(self.started)
        self.update_log = RoundLog(run_dir / UPDATES_NAME, UPDATE_FIELDS)

    # -- the run ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.state.traffic_bytes += self.transport.take_bytes()  # set-up broadcast
        self.log.info("%d workers, %s aggregation, SSP staleness bound %d%s, model %s (%d parameters)",
                      len(self.workers), self.cfg.aggregation.method, self.cfg.aggregation.ssp,
                      " with staleness damping" if self.cfg.aggregation.staleness_damping else "",
                      self.cfg.model.name, self.codec.size)
        try:
            self.state.stop_reason = self.run_rounds()
            self.drain()
            self.release_workers()
            # Workers are busy with updates while SSP runs, so its checkpoints carry no optimizer state.
            return self.finish({})
        finally:
            self.round_log.close()
            self.update_log.close()

    def run_rounds(self) -> str:
        self.dispatch_ready()
        round_index = self.start_round
        while round_index < self.cfg.train.epochs:
            self.merge_next(round_index)
            full = len(self.window.records) == len(self.workers)
            if full and self.cfg.aggregation.method == "best":
                self.elect()
            self.dispatch_ready()  # before evaluating, so that workers do not wait on it
            if full:
                reason = self.close_round(round_index)
                if reason:
                    return reason
                round_index += 1
        return "epochs"

    # -- handing out work ---------------------------------------------------
    def dispatch_ready(self) -> None:
        for worker in self.workers:
            if worker not in self.in_flight and self.dispatched < self.update_budget \
                    and self.clock.may_start(worker):
                self.dispatch(worker)

    def dispatch(self, worker: int) -> None:
        clock = self.clock.clocks[worker]
        self.transport.send_object(Order(UPDATE, clock, {"version": self.version}), worker, TAG_ORDER)
        started = time.perf_counter()
        self.transport.send_array(self.global_weights, worker)
        self.window.comm_seconds += time.perf_counter() - started
        self.in_flight[worker] = InFlight(clock, self.version, self.global_weights.copy(),
                                          self.clock.lead(worker), time.perf_counter())
        self.dispatched += 1

    # -- taking updates in --------------------------------------------------
    def receive_update(self) -> tuple[Report, np.ndarray, int]:
        """The first update to arrive from any worker: its report, weights and bytes."""
        try:
            message = self.transport.recv_object(tag=TAG_REPORT, timeout=self.worker_timeout)
        except TimeoutError:
            raise self.watchdog_failure("return an update", sorted(self.in_flight)) from None
        started = time.perf_counter()
        weights = self.transport.recv_array(self.codec.empty(), source=message.source)
        self.window.comm_seconds += time.perf_counter() - started
        return message.payload, weights.payload, message.nbytes + weights.nbytes

    def merge_next(self, round_index: int) -> None:
        report, local, nbytes = self.receive_update()
        arrived = time.perf_counter()
        flight = self.in_flight.pop(report.rank)
        self.clock.finish(report.rank)
        share = self.merge(report, local, flight)
        self.version += 1
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
        method = self.cfg.aggregation.method
        if method == "best":
            if self.best.offer(report.rank, report.val_accuracy, report.val_loss, local):
                self.window.leader = report
            return float("nan")
        share = merge_share(method, report.samples, self.plan.num_train, len(self.workers),
                            flight.staleness, self.cfg.aggregation.staleness_damping)
        merge_delta(self.global_weights, local, flight.base, share)
        return share

    def elect(self) -> None:
        winner, weights = self.best.close()
        self.global_weights = weights
        self.window.winner = winner
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in self.window.reports)
        self.log.info("window election: %s -> rank %d", scores, winner)

    def log_update(self, record: UpdateRecord, report: Report) -> None:
        # val_* are the worker's own scores on the validation split, sent only for ``best`` (NaN otherwise).
        row = {**asdict(record), "update": record.version - 1, "train_loss": report.train_loss,
               "val_loss": report.val_loss, "val_accuracy": report.val_accuracy,
               "elapsed_seconds": time.perf_counter() - self.started}
        self.update_log.write(row)
        self.log.debug("update %d from rank %d: clock %d, started from version %d, staleness %d, "
                       "%d versions behind, share %.4g", record.version - 1, record.worker, record.clock,
                       record.base_version, record.staleness, record.versions_behind, record.share)

    # -- rounds -------------------------------------------------------------
    def close_round(self, round_index: int) -> str | None:
        """Evaluate and record the round made of the last ``W`` updates; returns a stop reason or None."""
        window = self.window
        if not np.all(np.isfinite(self.global_weights)):
            losses = {r.rank: r.train_loss for r in window.reports}
            self.log.error("round %d: merged weights are not finite (worker train losses %s); stopping, keeping "
                           "the best weights", round_index, losses)
            return "nan"
        evaluation, eval_seconds = self.evaluate()
        self.aggregate_seconds = window.merge_seconds
        reports = sorted(window.reports, key=lambda r: (r.rank, r.round))
        row = self.round_row(round_index, reports, self.transport.take_bytes() + window.received_bytes,
                             window.winner, evaluation, window.leader)
        ended = time.perf_counter()
        row.update(wall_seconds=ended - window.started, eval_seconds=eval_seconds,
                   comm_seconds=window.comm_seconds,
                   max_staleness=max(record.staleness for record in window.records),
                   idle_fraction=idle_fraction(ended - window.started, self.busy_in(window, ended)),
                   block_sizes=";".join(str(end - start) for start, end in self.plan.block_bounds))
        self.record(row)
        self.window = Window(ended)
        stop = self.early.update(round_index, row[self.cfg.early_stopping.monitor], self.global_weights)
        self.maybe_checkpoint(round_index)
        return "early_stopping" if stop else None

    def maybe_checkpoint(self, round_index: int, force: bool = False,
                         states: dict[int, np.ndarray] | None = None) -> None:
        # Asking a busy worker for its optimizer state mid-update could leave both waiting on each other.
        super().maybe_checkpoint(round_index, force, {} if states is None else states)

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
            self.state.traffic_bytes += nbytes
        self.state.traffic_bytes += self.transport.take_bytes()
