"""The messages the scheduler and the workers exchange: the plan, orders, reports and moved rows.

Plain dataclasses, pickled by the transport; :mod:`mpi_trainer.comm.protocol` says
on which tag and in which order each travels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np


class OrderKind(str, Enum):
    ROUND = "round"  # a synchronous round: take the broadcast, train, report, contribute
    UPDATE = "update"  # SSP: take the weights point to point, train once, send report and weights back
    SEND_WEIGHTS = "send_weights"  # best-of: the elected worker sends its candidate
    SEND_OPTIMIZER = "send_optimizer"  # the checkpoint wants the worker's optimizer state
    EVALUATE = "evaluate"  # evaluation.where = "workers": take the broadcast, score a shard, add its metric state
    STOP = "stop"

    __str__ = str.__str__


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


@dataclass
class Order:
    """Scheduler -> worker. Only ``kind`` is always set; the rest applies to some kinds.

    ``round``: the synchronous round (ROUND). ``clock``/``version``: the SSP
    update's clock (the round its data follows) and the global version it
    starts from (UPDATE). With ROUND, and with UPDATE after a re-cut: ``blocks``
    (every worker's ``[start, end)``), ``moved_rows`` (under scatter, that many
    rows follow the order). With ROUND: ``learning_rate``, ``reset_optimizer``
    (after a NaN rollback), ``optimizer_state`` (a resumed state follows the
    order), ``max_steps`` (the last, partial round under ``train.max_steps``),
    ``held_weights`` (no broadcast: the round starts from the weights of the
    last EVALUATE). With EVALUATE: ``round`` and ``score_validation`` (add the
    validation shard's state). Every order carries ``bound``.
    """

    kind: OrderKind
    round: int = -1
    clock: int = -1
    version: int = -1
    blocks: list[tuple[int, int]] | None = None
    moved_rows: int | None = None
    learning_rate: float | None = None
    reset_optimizer: bool = False
    optimizer_state: bool = False
    max_steps: int | None = None
    held_weights: bool = False
    score_validation: bool = False
    preempted: bool = False  # with STOP: the run stopped for a preemption (every rank exits 75)
    # The scheduler's wait bound when it sent the order (mpi_trainer.algorithms.wait_bounds): the
    # worker's waits until its next order last WORKER_FACTOR times as long. None: keep the last.
    bound: float | None = None

    def describe(self) -> str:
        """What the worker does for this order, as a timeout names it."""
        if self.kind == OrderKind.ROUND:
            return f"round {self.round}"
        if self.kind == OrderKind.UPDATE:
            return f"the update at clock {self.clock}"
        return f"the order {self.kind.value!r}"


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
