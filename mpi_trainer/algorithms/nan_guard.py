"""Detecting non-finite training results and choosing what to do about them.

``train.nan_policy = "stop"`` ends the run and keeps the best weights seen;
``"rollback"`` restores the last checkpoint, halves the learning rate, resets
the workers' optimizer state and runs the round again. A run that keeps
producing non-finite values stops after :data:`MAX_CONSECUTIVE_ROLLBACKS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mpi_trainer.algorithms.passes import all_finite

MAX_CONSECUTIVE_ROLLBACKS = 3
STOP = "stop"
ROLLBACK = "rollback"


@dataclass
class WorkerOutcome:
    """The parts of a worker's report the guard looks at."""

    rank: int
    train_loss: float
    weights_finite: bool


def non_finite_cause(outcomes: Sequence[WorkerOutcome], aggregate: np.ndarray | bool | None = None) -> str | None:
    """A sentence naming what is not finite (the workers' outcomes, then ``aggregate`` when given: the
    values, or whether they were found finite already), or None."""
    bad_loss = [o.rank for o in outcomes if not math.isfinite(o.train_loss)]
    bad_weights = [o.rank for o in outcomes if not o.weights_finite]
    parts = []
    if bad_loss:
        parts.append(f"non-finite training loss from worker rank(s) {bad_loss}")
    if bad_weights:
        parts.append(f"non-finite weights from worker rank(s) {bad_weights}")
    if not parts and aggregate is not None:
        finite = aggregate if isinstance(aggregate, bool) else all_finite(aggregate)  # one pass, no temporary
        if not finite:
            parts.append("non-finite aggregated weights")
    return "; ".join(parts) or None


def decide(policy: str, consecutive_rollbacks: int) -> str:
    """``stop`` or ``rollback`` for the next non-finite round."""
    if policy == ROLLBACK and consecutive_rollbacks < MAX_CONSECUTIVE_ROLLBACKS:
        return ROLLBACK
    return STOP
