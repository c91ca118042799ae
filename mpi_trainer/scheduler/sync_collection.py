"""How the synchronous engine collects a round: every worker's report, then the weights.

For ``average`` / ``weighted`` one sum of the workers' scaled weights (in float32,
whatever the wire dtype: :meth:`~mpi_trainer.comm.wire_dtype.WireFormat.sum_to_root`);
for ``best`` the scores decide and only the winner's weights travel. A mixin of
:class:`~mpi_trainer.scheduler.synchronous.SynchronousEngine`.
"""

from __future__ import annotations

import time

from mpi_trainer.algorithms import aggregation
from mpi_trainer.comm.messages import Report
from mpi_trainer.scheduler.round_row import ClosedRound


class RoundCollection:
    """Collecting a synchronous round (reports first, so the watchdog can name a missing rank)."""

    def collect(self, started: float, round_index: int) -> ClosedRound:
        reports, received = self.recv_reports(started, round_index)
        self.observers.span("wait", round_index)
        self.observers.worker_phases(reports)
        closed = ClosedRound(round_index, reports, received, 0.0)
        if self.cfg.aggregation.elects:
            self.collect_best(closed)
        else:
            self.collect_reduced(closed)
        return closed

    def recv_reports(self, started: float, round_index: int) -> tuple[list[Report], int]:
        """Every worker's report, sorted by rank, and their bytes.

        Rounds of a few steps come at a steady pace: the reports are expected as long after the
        round's start as the last round's came, and the wait polls finely around then.
        """
        reports, received = [], 0
        due = None if self.report_lag is None else started + self.report_lag
        for _ in self.workers:
            try:
                message = self.link.recv_report(self.watchdog.remaining(started), due)
            except TimeoutError:
                missing = sorted(set(self.workers) - {r.rank for r in reports})
                raise self.watchdog.failure(f"report round {round_index}", missing) from None
            reports.append(message.payload)
            received += message.nbytes + message.payload.bytes_before_report
        self.report_lag = time.perf_counter() - started
        return sorted(reports, key=lambda r: r.rank), received

    def collect_reduced(self, closed: ClosedRound) -> None:
        """average / weighted: reports first (so the watchdog can name a missing rank), then one sum."""
        try:
            self.weights = self.link.sum_weights(self.wire, self.codec.size, self.watchdog.timeout)
        except TimeoutError as exc:
            raise self.timed_out("complete the weights reduction", exc, self.workers) from None
        self.observers.span("aggregate", closed.index)
        closed.bytes += self.wire_bytes * len(self.workers)  # every worker put one model into the sum

    def collect_best(self, closed: ClosedRound) -> None:
        """best: scores travel first, then only the winner's weights."""
        started = time.perf_counter()
        winner = aggregation.elect({r.rank: (r.val_accuracy, r.val_loss) for r in closed.reports})
        try:
            message = self.link.request_weights(winner, self.wire.empty(self.codec.size), self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure(f"send its weights for round {closed.index}", [winner]) from None
        self.weights = self.wire.decode(message.payload)
        self.observers.span("aggregate", closed.index, started)
        closed.winner, closed.bytes = winner, closed.bytes + message.nbytes
        closed.aggregate_seconds = time.perf_counter() - started
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in closed.reports)
        self.log.info("round %d election: %s -> rank %d", closed.index, scores, winner)
