"""What travels between the scheduler and the workers (besides weight buffers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpi_trainer.models import ModelSpec

ROUND = "round"
SEND_WEIGHTS = "send_weights"
SEND_OPTIMIZER = "send_optimizer"
STOP = "stop"
UPDATE = "update"  # SSP: receive the global weights point to point, train once, send back


@dataclass
class JobPlan:
    """Broadcast once at set-up: everything a worker needs to start."""

    config: dict[str, Any]
    model: ModelSpec
    block_bounds: list[tuple[int, int]]
    shuffle_seed: int
    num_train: int
    start_round: int = 0


@dataclass
class Order:
    """Scheduler -> worker: run a round, send your weights (best-of winner), run an SSP update, or stop.

    A round's ``detail`` may carry ``blocks`` (every worker's ``[start, end)`` bounds after
    rebalancing), ``moved_rows`` (under scatter, after a re-cut: that many training rows follow
    on TAG_DATA as positions, features, labels), ``learning_rate`` (a new rate),
    ``reset_optimizer`` (after a NaN rollback), ``optimizer_state`` (a resumed state follows
    on TAG_STATE) and ``max_steps`` (the last, partial round under train.max_steps).
    """

    kind: str
    round: int = -1
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Report:
    """Worker -> scheduler after a round of local training."""

    rank: int
    round: int
    samples: int
    train_loss: float
    train_accuracy: float
    train_seconds: float
    val_loss: float = float("nan")
    val_accuracy: float = float("nan")
    eval_seconds: float = 0.0
    bytes_before_report: int = 0
    steps: int = 0
    weights_finite: bool = True
