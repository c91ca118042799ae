"""The sections that say how a run is kept and watched: ``checkpoint``, ``comm``, ``watchdog``,
``fault``, ``log``, and the test hooks of ``debug`` (hidden from the public schema)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from mpi_trainer.config.choices import (
    CRASH_PHASES,
    CrashPhase,
)
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


@dataclass
class DebugConfig(Section):
    """Test hooks: testing and benchmarking aids, off by default and outside the normal training path.

    They are not part of the public schema: ``check``, a run directory's
    config.toml, summary.json and the unknown-key hints leave them out, but
    ``--set debug.<name>=...`` (or a ``[debug]`` table) still sets them.

    ``batch_delay`` makes every worker sleep that many seconds after each
    training batch: simulated per-batch work, so that benchmarks on a small,
    busy machine measure scheduling rather than CPU contention. Each rank in
    ``slow_ranks`` then takes ``slow_factor`` times as long per batch (batch
    plus delay) and plays a straggler. ``async_engine`` runs the bounded-staleness
    engine even at ``aggregation.ssp = 0``, to check it against the synchronous one.
    ``nan_rank`` (0 = off) poisons that worker's weights with NaN in round
    ``nan_round``, to exercise the NaN guard. ``reset_optimizer`` zeroes every
    worker's optimizer state at the start of each synchronous round instead of
    carrying it across averagings, to measure what carrying it is worth.
    ``crash_rank`` (0 = off) ends that worker (its starting rank) as ``kill -9`` would, in round
    ``crash_round``: at the start of its training (``crash_phase = "train"``) or after it sent its
    report, before its weights go out (``"contribute"``), to exercise ``fault.survive``.
    ``freeze_rank`` (-1 = off) stops that rank with SIGSTOP, as a hung process would
    stop: during set-up when ``freeze_round`` is -1, else once its part of round
    ``freeze_round`` is done (a worker then sits idle; SSP counts its updates).
    """

    prefix: ClassVar[str] = "debug"
    slow_ranks: list[int] = field(default_factory=list)
    slow_factor: float = 1.0
    batch_delay: float = 0.0
    async_engine: bool = False
    nan_rank: int = 0
    nan_round: int = 0
    reset_optimizer: bool = False
    crash_rank: int = 0
    crash_round: int = 0
    crash_phase: CrashPhase = "contribute"
    freeze_rank: int = -1
    freeze_round: int = -1

    def __post_init__(self) -> None:
        self._require(self.slow_factor >= 1, "slow_factor", "must be >= 1 (1 = normal speed)")
        self._require(self.freeze_rank >= -1, "freeze_rank", "must be a rank, or -1 (off)")
        self._require(self.freeze_round >= -1, "freeze_round", "must be a round, or -1 (during set-up)")
        self._non_negative("batch_delay", "nan_rank", "nan_round", "crash_rank", "crash_round")
        self._choice("crash_phase", CRASH_PHASES)
        self._require(all(rank >= 1 for rank in self.slow_ranks), "slow_ranks",
                      "must list worker ranks (each >= 1; rank 0 is the scheduler)")
