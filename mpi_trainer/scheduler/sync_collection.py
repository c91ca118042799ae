"""How the synchronous engine collects a round: every worker's report, then the weights.

For ``average`` / ``weighted`` one sum of the workers' scaled weights (in float32,
whatever the wire dtype: :meth:`~mpi_trainer.comm.wire_dtype.WireFormat.sum_parts_at_root`),
handed over part by part as each part is complete; for ``best`` the scores decide and only
the winner's weights travel. The :class:`RoundCollector` is held by
:class:`~mpi_trainer.scheduler.synchronous.SynchronousEngine`, which hands it the round's start,
its workers and what takes the aggregate, and takes back the round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from logging import Logger

import numpy as np

from mpi_trainer.algorithms import aggregation
from mpi_trainer.comm.messages import Report
from mpi_trainer.comm.protocol import SchedulerLink
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.reporting.observers import RunObservers
from mpi_trainer.scheduler.round_row import ClosedRound
from mpi_trainer.scheduler.watchdog import Watchdog

Take = Callable[[int, np.ndarray], None]  # (the part's first position, its values) of a round's aggregate


class RoundCollector:
    """Collecting a synchronous round (reports first, so the watchdog can name a missing rank).

    ``elects``: ``aggregation.method = "best"``; ``size``: the parameters in one copy of the weights.
    """

    def __init__(self, link: SchedulerLink, wire: WireFormat, size: int, watchdog: Watchdog,
                 observers: RunObservers, log: Logger, elects: bool) -> None:
        self.link, self.wire, self.size, self.watchdog = link, wire, size, watchdog
        self.observers, self.log, self.elects = observers, log, elects
        # seconds from the last round's start to its last report: when this round's reports are due
        self.report_lag: float | None = None

    def collect(self, started: float, round_index: int, workers: list[int], take: Take) -> ClosedRound:
        """The round that started at ``started`` on ``workers``: its reports, then its aggregated (or elected)
        weights to ``take(start, values)`` in parts (:meth:`weights`)."""
        closed = self.reports(started, round_index, workers)
        self.weights(closed, workers, take)
        return closed

    def reports(self, started: float, round_index: int, workers: list[int]) -> ClosedRound:
        """The round's reports (first, so the watchdog can name a missing rank), before its weights."""
        reports, received = self.recv_reports(started, round_index, workers)
        self.observers.span("wait", round_index)
        self.observers.worker_phases(reports)
        return ClosedRound(round_index, reports, received, 0.0)

    def weights(self, closed: ClosedRound, workers: list[int], take: Take) -> None:
        """The round's aggregate to ``take(start, values)``: average / weighted, the workers' sum part by part as
        each part is complete (``values`` is then a scratch part that the next one overwrites); best, the
        winner's weights in one part."""
        if self.elects:
            take(0, self.collect_best(closed))
        else:
            self.collect_reduced(closed, workers, take)

    def recv_reports(self, started: float, round_index: int, workers: list[int]) -> tuple[list[Report], int]:
        """Every worker's report, sorted by rank, and their bytes.

        Rounds of a few steps come at a steady pace: the reports are expected as long after the
        round's start as the last round's came, and the wait polls finely around then.
        """
        reports: list[Report] = []
        received = 0
        due = None if self.report_lag is None else started + self.report_lag
        for _ in workers:
            try:
                message = self.link.recv_report(self.watchdog.remaining(started), due)
            except TimeoutError:
                missing = sorted(set(workers) - {r.rank for r in reports})
                raise self.watchdog.failure(f"report round {round_index}", missing) from None
            report: Report = message.payload
            reports.append(report)
            received += message.nbytes + report.bytes_before_report
        self.report_lag = time.perf_counter() - started
        return sorted(reports, key=lambda r: r.rank), received

    def collect_reduced(self, closed: ClosedRound, workers: list[int], take: Take) -> None:
        """average / weighted: one sum, taken part by part."""
        try:
            self.link.sum_weights(self.wire, self.size, take, self.watchdog.timeout)
        except TimeoutError as exc:
            raise self.watchdog.timed_out("complete the weights reduction", exc, workers) from None
        self.observers.span("aggregate", closed.index)
        closed.bytes += self.size * self.wire.itemsize * len(workers)  # every worker put one model into the sum

    def collect_best(self, closed: ClosedRound) -> np.ndarray:
        """best: scores travel first, then only the winner's weights."""
        started = time.perf_counter()
        winner = aggregation.elect({r.rank: (r.val_accuracy, r.val_loss) for r in closed.reports})
        try:
            message = self.link.request_weights(winner, self.wire.empty(self.size), self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure(f"send its weights for round {closed.index}", [winner]) from None
        weights = self.wire.decode(message.payload)
        self.observers.span("aggregate", closed.index, started)
        closed.winner, closed.bytes = winner, closed.bytes + message.nbytes
        closed.aggregate_seconds = time.perf_counter() - started
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in closed.reports)
        self.log.info("round %d election: %s -> rank %d", closed.index, scores, winner)
        return weights
