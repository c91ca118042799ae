"""How long a rank waits for its peers before it names them and ends the job.

Every wait has a bound, on by default. Set-up (reading the data, building and
compiling the model) and the first round, which compiles the training step,
get a fixed floor, ``SETUP_SECONDS``. From then on a wait may last
``ROUND_MULTIPLE`` times the slowest whole round seen so far (from one round's
close to the next: training, collection, evaluation, checkpoint), and never
less than ``ROUND_FLOOR``, which covers a pause of the scheduler that a fast
round does not show (a slow disk under a checkpoint, a garbage collection).
``watchdog.setup_timeout`` and ``watchdog.worker_timeout`` replace the derived
values when set.

A worker waits on the scheduler ``WORKER_FACTOR`` times as long as the
scheduler waits on a worker: when a worker stops, the scheduler, which knows
who is missing, runs out first and names it; a worker names the scheduler only
when the scheduler itself stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

SETUP_SECONDS = 600.0
ROUND_MULTIPLE = 10.0
ROUND_FLOOR = 60.0
WORKER_FACTOR = 2.0


def for_rank(rank: int, seconds: float) -> float:
    """The bound of ``rank``'s waits when the scheduler's is ``seconds``."""
    return seconds if rank == 0 else seconds * WORKER_FACTOR


@dataclass
class WaitBounds:
    """The scheduler's bounds: explicit settings (0: derived) and the slowest round so far."""

    setup_timeout: float = 0.0  # watchdog.setup_timeout
    worker_timeout: float = 0.0  # watchdog.worker_timeout
    slowest: float = 0.0  # seconds of the slowest whole round observed (0: none yet)

    @property
    def setup(self) -> float:
        """Seconds a set-up wait may last."""
        return self.setup_timeout or SETUP_SECONDS

    @property
    def round(self) -> float:
        """Seconds a round's wait may last: explicit, else the set-up floor until a round is measured,
        else a multiple of the slowest round with a floor."""
        if self.worker_timeout:
            return self.worker_timeout
        if not self.slowest:
            return self.setup
        return max(ROUND_FLOOR, ROUND_MULTIPLE * self.slowest)

    def observe(self, seconds: float) -> None:
        """A whole round took ``seconds``."""
        self.slowest = max(self.slowest, seconds)

    def describe(self) -> str:
        """Where the round bound comes from, for the message that names a missing rank."""
        if self.worker_timeout:
            return f"watchdog.worker_timeout={self.worker_timeout:g} s"
        if not self.slowest:
            source = (f"watchdog.setup_timeout={self.setup_timeout:g} s" if self.setup_timeout
                      else f"the default for set-up and the first round, {SETUP_SECONDS:g} s")
            return f"{self.round:g} s ({source}; set watchdog.worker_timeout to change it)"
        return (f"{self.round:.3g} s (the default: {ROUND_MULTIPLE:g} x the slowest round so far, "
                f"{self.slowest:.3g} s, at least {ROUND_FLOOR:g} s; set watchdog.worker_timeout to change it)")


STALL_FACTOR = 3.0


@dataclass
class StallWatch:
    """The launcher's backstop: how long a job may go without writing a new round to ``rounds.csv``.

    The ranks' own bounds end a job whose rank stops; this one also ends a job that stops as a
    whole (every process frozen, a node swapping, a hang outside MPI). With ``watchdog.stall_seconds``
    set, it is that many seconds from the attempt's start or its last row. By default it arms
    at the attempt's first row (set-up is the ranks' to bound), allows ``STALL_FACTOR`` times the
    rank bound, measured on the longest gap between rows so far (the first gap counts from the
    attempt's start, so it holds set-up and compilation), and disarms while the run is complete:
    a supervised script may go on working after its ``fit`` returns.
    """

    explicit: float = 0.0  # watchdog.stall_seconds (0: derived)
    started: float = 0.0  # when the attempt began (monotonic seconds)
    last: float | None = None  # when rounds.csv last changed
    longest: float = 0.0  # the longest gap between changes so far
    complete: bool = False  # the run's summary says it is complete

    def progressed(self, now: float, complete: bool = False) -> None:
        """rounds.csv changed at ``now``; ``complete``: the run is now marked complete."""
        self.longest = max(self.longest, now - (self.started if self.last is None else self.last))
        self.last, self.complete = now, complete

    @property
    def limit(self) -> float | None:
        """Seconds without a change before the attempt counts as stalled; None: not armed."""
        if self.explicit:
            return self.explicit
        if self.last is None or self.complete:
            return None
        return STALL_FACTOR * max(ROUND_FLOOR, ROUND_MULTIPLE * self.longest)

    def expired(self, now: float) -> bool:
        limit = self.limit
        since = self.started if self.last is None else self.last
        return limit is not None and now - since > limit

    def describe(self) -> str:
        if self.explicit:
            return f"{self.explicit:g} s (watchdog.stall_seconds)"
        return (f"{self.limit or 0:.3g} s (the default: {STALL_FACTOR:g} x {ROUND_MULTIPLE:g} x the longest gap "
                f"between rounds so far, {self.longest:.3g} s, at least {STALL_FACTOR * ROUND_FLOOR:g} s; set "
                f"watchdog.stall_seconds to change it)")
