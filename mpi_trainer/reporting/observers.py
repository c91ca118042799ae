"""What rank 0 does with each recorded round besides rounds.csv: progress, TensorBoard, timeline.

The scheduler holds one :class:`RunObservers` and calls ``write_round(row)``
once per recorded round, ``span(name, round, since)`` when one of its own phases ends,
``worker_phases(reports)`` with each batch of reports, and ``close()`` at the
end (also after a failure, so what was seen so far is kept).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer.config import Config
from mpi_trainer.persistence.run_files import TIMELINE_NAME
from mpi_trainer.reporting.progress import RoundProgress
from mpi_trainer.reporting.timeline import Timeline

if TYPE_CHECKING:
    from mpi_trainer.comm.messages import Report

TIMELINE_EVERY_SECONDS = 10.0  # rewrite timeline.json at most this often during a run


class RunObservers:
    """``kept_rounds``: the rows of rounds.csv that a resumed run keeps; what an earlier attempt
    showed of later rounds (run again now) is dropped from TensorBoard and the timeline."""

    def __init__(self, cfg: Config, run_dir: Path, start_round: int, hosts: list[str],
                 kept_rounds: Sequence[Mapping[str, Any]] = ()) -> None:
        self.run_dir = Path(run_dir)
        self.progress = RoundProgress(cfg.train.epochs, start_round)
        self.tensorboard = None
        if cfg.log.tensorboard:
            from mpi_trainer.reporting.tensorboard import TensorBoardRounds

            self.tensorboard = TensorBoardRounds(self.run_dir, kept_rounds)
        self.timeline = (Timeline.load(self.run_dir / TIMELINE_NAME, through_round=start_round - 1)
                         if cfg.log.timeline else None)
        if self.timeline is not None:
            for rank, host in enumerate(hosts):
                role = "scheduler" if rank == 0 else "worker"
                self.timeline.name_rank(rank, f"rank {rank} {role} ({host})")
        self.timeline_written = time.monotonic()
        self.last_end: float | None = None
        # perf_counter -> wall clock, fixed once so that rank 0's spans meet exactly.
        self.wall_offset = time.time() - time.perf_counter()

    def write_round(self, row: Mapping[str, Any]) -> None:
        self.progress.update(row)
        if self.tensorboard is not None:
            self.tensorboard.write_round(row)
        if self.timeline is not None and time.monotonic() - self.timeline_written > TIMELINE_EVERY_SECONDS:
            self.write_timeline()

    def span(self, name: str, round_index: int, since: float | None = None) -> None:
        """Rank 0's own phase (send, wait, aggregate, evaluate, checkpoint) ending now.

        ``since`` is a ``time.perf_counter()`` reading (the scheduler's clock); without it the
        phase starts where rank 0's previous one ended, which is right for steps that follow
        each other with nothing in between (the wait for reports after the send).
        """
        now = time.perf_counter()
        start = self.last_end if since is None else since
        self.last_end = now
        if self.timeline is not None and start is not None:
            self.timeline.add(0, name, start + self.wall_offset, now + self.wall_offset, round_index)

    def worker_phases(self, reports: Iterable[Report]) -> None:
        """The phases each report carries (see :class:`~mpi_trainer.reporting.timeline.PhaseLog`)."""
        if self.timeline is None:
            return
        for report in reports:
            self.timeline.add_phases(report.rank, report.phases)

    def write_timeline(self) -> None:
        if self.timeline is None:  # log.timeline = false
            return
        self.timeline.write(self.run_dir / TIMELINE_NAME)
        self.timeline_written = time.monotonic()

    def close(self) -> None:
        self.progress.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.timeline is not None:
            self.write_timeline()
