"""The sections that say how a run is kept and watched: ``checkpoint``, ``comm``, ``watchdog``,
``fault`` and ``log``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from mpi_trainer.config.section import Section

PREEMPT_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGINT")


@dataclass
class CheckpointConfig(Section):
    """When rank 0 checkpoints: every ``every`` rounds (0: off), after any round that ends at least
    ``every_seconds`` after the last checkpoint (0: off), at the end, and on preemption: one of
    ``preempt_signals`` makes the job checkpoint after the current round and exit 75, or exit 75
    anyway ``grace_seconds`` after the signal (0: no limit)."""

    prefix: ClassVar[str] = "checkpoint"
    every: int = 0
    every_seconds: float = 120.0
    grace_seconds: float = 25.0
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])

    def __post_init__(self) -> None:
        self._non_negative("every", "every_seconds", "grace_seconds")
        self._require(isinstance(self.preempt_signals, list) and all(
            s in PREEMPT_SIGNALS for s in self.preempt_signals), "preempt_signals",
            f"must be a list of signal names from {list(PREEMPT_SIGNALS)} (empty: no preemption handling)")


@dataclass
class CommConfig(Section):
    prefix: ClassVar[str] = "comm"
    # Longest sleep between two polls of a pending MPI request, in seconds. Polling keeps a
    # waiting rank off the CPU; 0 selects plain blocking MPI waits, which spin a core.
    poll_interval: float = 0.005

    def __post_init__(self) -> None:
        self._non_negative("poll_interval")
        self._require(self.poll_interval <= 1.0, "poll_interval", "must be <= 1 second")


@dataclass
class WatchdogConfig(Section):
    """Seconds a rank waits for its peers before it names them and ends the job.

    0 = the default bound (mpi_trainer.algorithms.wait_bounds): ``setup_timeout`` 600 s for
    set-up and the first round; ``worker_timeout`` 10 x the slowest round so far, at least
    60 s. ``stall_seconds`` (launcher only): seconds without a new round before a restart; 0 = the
    default, 3 x 10 x the longest gap between rounds so far, at least 180 s, armed from the first
    round until the run is complete (wait_bounds.StallWatch).
    """

    prefix: ClassVar[str] = "watchdog"
    worker_timeout: float = 0.0
    setup_timeout: float = 0.0
    stall_seconds: float = 0.0

    def __post_init__(self) -> None:
        self._non_negative("worker_timeout", "setup_timeout", "stall_seconds")


@dataclass
class FaultConfig(Section):
    """Surviving a lost worker inside the running job (Open MPI's fault-tolerant MPI, ULFM).

    ``survive``: when a worker rank dies, the scheduler and the other workers shrink the job to
    the survivors, re-plan the blocks and train the interrupted round again from its starting
    weights (docs/fault-tolerance.md); ``launch`` starts mpirun with the options this needs.
    ``min_workers``: below this many workers the job checkpoints and exits for ``launch`` to restart.
    """

    prefix: ClassVar[str] = "fault"
    survive: bool = False
    min_workers: int = 1

    def __post_init__(self) -> None:
        self._require(isinstance(self.survive, bool), "survive", "must be true or false")
        self._positive("min_workers")


@dataclass
class LogConfig(Section):
    """Console verbosity, and what rank 0 writes to see a run (docs/observability.md).

    ``plots`` runs the report (PNG plots and report.txt) at the end of ``train``;
    ``tensorboard`` writes per-round scalars as TensorBoard event files;
    ``timeline`` writes every rank's phases per round as a Chrome trace.
    """

    prefix: ClassVar[str] = "log"
    verbosity: int = 1
    plots: bool = True
    tensorboard: bool = True
    timeline: bool = False

    def __post_init__(self) -> None:
        self._require(self.verbosity in (0, 1, 2), "verbosity", "must be 0, 1 or 2")
