"""Stale synchronous parallel (SSP): the staleness clock and the merge rules, pure Python.

Vocabulary used across mpi_trainer:

* a worker's **clock** is the number of updates it has finished;
* the **staleness bound** ``s`` lets a worker whose clock is ``c`` start its
  next update only while ``c - min(clocks) <= s``: it may run at most ``s``
  updates ahead of the slowest worker (``s = 0`` is BSP);
* an update's **staleness** is how far ahead of the slowest worker its author
  was when it started, ``c - min(clocks)`` at dispatch, so it never exceeds ``s``;
* the global **version** counts merged updates; an update records the version
  it started from, and ``versions_behind`` is how many other updates were
  merged while it was being computed;
* an SSP **round** closes every ``W`` merged updates (``W`` = workers), which
  at ``s = 0`` is exactly one synchronous round.

``average`` / ``weighted`` merge an update as a delta against the version its
author started from, ``global += share * (local - base)``, so a stale update
adds what its author learnt instead of pulling the model back to an old state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from mpi_trainer.algorithms import aggregation


class StalenessClock:
    """The per-worker clocks and the SSP admission rule."""

    def __init__(self, workers: Sequence[int], staleness_bound: int, start: int = 0) -> None:
        """``start``: every worker's clock at the beginning (a resumed run starts at its next round)."""
        if staleness_bound < 0:
            raise ValueError(f"staleness_bound must be >= 0. Received: staleness_bound={staleness_bound}")
        if not workers:
            raise ValueError("an SSP clock needs at least one worker")
        self.staleness_bound = staleness_bound
        self.clocks = {worker: start for worker in sorted(workers)}

    @property
    def slowest(self) -> int:
        return min(self.clocks.values())

    def lead(self, worker: int) -> int:
        """How many updates ``worker`` is ahead of the slowest worker."""
        return self.clocks[worker] - self.slowest

    def may_start(self, worker: int) -> bool:
        return self.lead(worker) <= self.staleness_bound

    def finish(self, worker: int) -> int:
        """Count one finished update for ``worker``; returns its new clock."""
        self.clocks[worker] += 1
        return self.clocks[worker]


def merge_share(method: str, samples: int, total_samples: int, workers: int, staleness: int,
                damping: bool) -> float:
    """The factor applied to an update's delta.

    The undamped share is the synchronous rule's (``1/W`` or ``n_w / N``), so at
    ``s = 0`` the W merged deltas of a round add up to the synchronous
    aggregate. With ``damping`` the share is divided by ``1 + staleness``: an
    update computed while its author was ``k`` rounds ahead of the slowest
    worker carries ``1/(k+1)`` of its weight, the usual staleness-aware rule
    that keeps fast workers from dominating the model.
    """
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0. Received: staleness={staleness}")
    share = aggregation.contribution_scale(method, samples, total_samples, workers)
    return share / (1 + staleness) if damping else share


def idle_fraction(wall_seconds: float, busy: Mapping[int, float]) -> float:
    """Straggler idle fraction: sum over workers of (wall - busy) / (W * wall)."""
    if wall_seconds <= 0 or not busy:
        return 0.0
    idle = sum(max(0.0, wall_seconds - min(b, wall_seconds)) for b in busy.values())
    return idle / (len(busy) * wall_seconds)
