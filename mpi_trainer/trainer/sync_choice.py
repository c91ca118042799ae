"""``train.sync_every = "auto"``: how many steps a round takes, chosen from what the job's second round cost.

A round costs its training (k steps of every worker) and what it spends besides, which does not grow
with k: Keras' ``fit`` call on each worker (its data adapter and callbacks), the workers' contributions,
their sum over the job's links, rank 0's combine and the combined state's return. Rank 0 measures both in
the job's second round (the first also traces the graphs, builds Keras' first iterator and maps the
shared window, once), which trains a whole epoch: a step's seconds (the slowest worker's median batch)
and the round's other seconds (its wall time on rank 0 less the slowest worker's seconds inside its
batches). From the next epoch a round takes the fewest steps that keep the other seconds under
:data:`SHARE` of it,

    k = ceil(other * (1 - SHARE) / (SHARE * step)),

and an epoch stays one round where k reaches the largest share's steps in an epoch (a slow link, or a
big model on a small input). On one node a small model's rounds cost little against its steps, so it
combines every few steps and converges per epoch nearer one process's; across a slow link it combines
once an epoch, as ``train.sync_every = 0`` does. The choice holds for the rest of the fit, and the log
says what was measured and chosen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

SHARE = 0.2  # the most of a round that its cost besides training may take
MEASURED_ROUND = 2  # the trained round measured: the first pays for the fit's start once


def median_step(durations: Sequence[float]) -> float:
    """A worker's step in seconds: the median of its batches, the first (which may trace the graphs) left out
    when there are others."""
    kept = list(durations[1:]) or list(durations)
    return statistics.median(kept) if kept else 0.0


def steps_for(other_seconds: float, step_seconds: float, epoch_steps: int, share: float = SHARE) -> int:
    """The steps a round takes so that ``other_seconds`` stays under ``share`` of it: 0 (a round per epoch)
    when that is the largest share's ``epoch_steps`` or more, or when a step's time is not known."""
    if step_seconds <= 0 or epoch_steps <= 1:
        return 0
    needed = max(other_seconds, 0.0) * (1 - share) / (share * step_seconds)
    steps = max(1, math.ceil(needed - 1e-9))  # a whole number of steps stays one, whatever the rounding
    return 0 if steps >= epoch_steps else steps


@dataclass
class SyncChoice:
    """Rank 0's choice of ``train.sync_every`` under ``"auto"``: 0 (a round per epoch) until the
    :data:`MEASURED_ROUND` is measured, then :func:`steps_for` of it. ``epoch_steps``: the largest share's
    batches in an epoch."""

    epoch_steps: int
    every: int = 0
    chosen: bool = False
    seen: int = 0  # trained rounds observed

    def observe(self, reports: Sequence[Any], round_seconds: float) -> str | None:
        """A round's reports and wall seconds on rank 0: at the :data:`MEASURED_ROUND` trained, choose, and
        say what and why (None before and after)."""
        trained = [report for report in reports if report.batches]
        if self.chosen or not trained:
            return None
        self.seen += 1
        if self.seen < MEASURED_ROUND:
            return None
        step = max(report.step_seconds for report in trained)
        other = round_seconds - max(report.batch_seconds for report in trained)
        self.every, self.chosen = steps_for(other, step, self.epoch_steps), True
        measured = (f"round {self.seen}'s cost besides training {other:.3f} s against a step's {step * 1000:.1f} ms, "
                    f"{self.epoch_steps} steps an epoch")
        if not self.every:
            return (f"train.sync_every = auto: one round per epoch ({measured}: rounds of fewer steps would spend "
                    f"more than {SHARE:.0%} of their time besides training)")
        return (f"train.sync_every = auto: {self.every} steps a round ({measured}: the fewest steps that keep it "
                f"under {SHARE:.0%} of a round)")


def not_applicable(kind: str, steps_per_epoch: Any, ssp: int, increment: bool, rebalance: bool,
                   max_steps: int) -> str | None:
    """Why ``"auto"`` stays at a round per epoch for this fit (None: it chooses)."""
    reasons = {"the input is not arrays given as `x`": kind != "arrays",
               "steps_per_epoch is given": steps_per_epoch is not None, "aggregation.ssp > 0": ssp > 0,
               "data.increment is enabled": increment, "data.rebalance is on": rebalance,
               "train.max_steps is set": max_steps > 0}
    return next((reason for reason, holds in reasons.items() if holds), None)
