"""The messages the scheduler and the workers exchange: the plan, orders, reports and moved rows.

Plain dataclasses, pickled by the transport (an order is a frozen one, one type per kind of order);
:mod:`mpi_trainer.comm.protocol` says on which tag and in which order each travels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class JobPlan:
    """Broadcast once at set-up: everything a worker needs to start."""

    config: dict[str, Any]
    model: Any  # models.ModelSpec: the architecture and compile settings
    block_bounds: list[tuple[int, int]]
    shuffle_seed: int
    num_train: int
    start_round: int = 0
    # What evaluation reports, ``loss`` first (learned from the dry run before round 0).
    metric_names: list[str] = field(default_factory=lambda: ["loss", "accuracy"])
    finished: bool = False  # the run directory holds a complete run and no more rounds are asked for
    # ``fit``'s class_weight ({class index: weight}): workers weight their training loss by it
    class_weight: dict[int, float] | None = None


# -- orders: scheduler -> worker, one type per kind -----------------------------------------------
# Every order carries ``bound``: the scheduler's wait bound when it sent the order
# (mpi_trainer.algorithms.wait_bounds); the worker's waits until its next order last WORKER_FACTOR
# times as long. None: keep the last. The link fills it in as the order leaves.


@dataclass(frozen=True)
class RoundOrder:
    """A synchronous round: take the broadcast, train, report, contribute.

    ``blocks``: every worker's ``[start, end)`` after a re-cut (None: unchanged); ``moved_rows``: under
    scatter, that many rows follow the order. ``learning_rate``: the rate to train at (None: keep it);
    ``reset_optimizer``: after a NaN rollback; ``optimizer_state``: a resumed state follows the order;
    ``max_steps``: the last, partial round under ``train.max_steps``; ``held_weights``: no broadcast,
    the round starts from the weights of the last :class:`EvaluateOrder`.
    """

    round: int
    blocks: list[tuple[int, int]] | None = None
    moved_rows: int | None = None
    learning_rate: float | None = None
    reset_optimizer: bool = False
    optimizer_state: bool = False
    max_steps: int | None = None
    held_weights: bool = False
    bound: float | None = None

    def describe(self) -> str:
        """What the worker does for this order, as a timeout names it."""
        return f"round {self.round}"


@dataclass(frozen=True)
class UpdateOrder:
    """SSP: take the weights point to point, train once, send the report and the weights back.

    ``clock``: the round the update's data follows; ``blocks``/``moved_rows`` as in :class:`RoundOrder`
    (the first update after a re-cut carries them); ``learning_rate``: a Keras callback's rate (None: keep it).
    """

    clock: int
    blocks: list[tuple[int, int]] | None = None
    moved_rows: int | None = None
    learning_rate: float | None = None
    bound: float | None = None

    def describe(self) -> str:
        return f"the update at clock {self.clock}"


@dataclass(frozen=True)
class SendWeightsOrder:
    """Best-of: the elected worker sends its candidate weights."""

    bound: float | None = None

    def describe(self) -> str:
        return "the order 'send_weights'"


@dataclass(frozen=True)
class SendOptimizerOrder:
    """The checkpoint wants the worker's optimizer state."""

    bound: float | None = None

    def describe(self) -> str:
        return "the order 'send_optimizer'"


@dataclass(frozen=True)
class EvaluateOrder:
    """``evaluation.where = "workers"``: take the broadcast of ``round``'s weights, score a shard of the
    test split (and of the validation split with ``score_validation``), add its metric state."""

    round: int
    score_validation: bool = False
    bound: float | None = None

    def describe(self) -> str:
        return "the order 'evaluate'"


@dataclass(frozen=True)
class StopOrder:
    """The run is over; ``preempted``: it stopped for a preemption (every rank exits 75)."""

    preempted: bool = False
    bound: float | None = None

    def describe(self) -> str:
        return "the order 'stop'"


# What the links carry from the scheduler to a worker; the worker dispatches on the type.
Order = RoundOrder | UpdateOrder | SendWeightsOrder | SendOptimizerOrder | EvaluateOrder | StopOrder


@dataclass
class Report:
    """Worker -> scheduler after local training (a round, or an SSP update at ``round`` = its clock)."""

    rank: int
    round: int
    samples: int
    train_loss: float
    train_accuracy: float
    train_seconds: float
    val_loss: float = float("nan")
    val_accuracy: float = float("nan")
    eval_seconds: float = 0.0
    # every compiled metric (``loss`` too): of the local training, and of the validation scoring (best-of)
    train_metrics: dict[str, float] = field(default_factory=dict)
    val_metrics: dict[str, float] = field(default_factory=dict)
    bytes_before_report: int = 0
    steps: int = 0
    weights_finite: bool = True
    # (phase, round, start, end) in time.time() seconds since the last report, for log.timeline
    phases: list[tuple[str, int, float, float]] = field(default_factory=list)
    # samples per second over the round's steady training steps (rebalancing reads it); None: none timed
    step_rate: float | None = None
    timed_steps: int = 0
    preempt: bool = False  # this worker got a preemption signal: checkpoint and stop after this round
    learning_rate: float = float("nan")  # the optimizer's learning rate at the start of the worker's training


@dataclass
class Rows:
    """Training rows by position in the training split (scatter placement)."""

    positions: np.ndarray
    x: np.ndarray
    y: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.positions.nbytes + self.x.nbytes + self.y.nbytes
