"""The record of a run that every engine keeps: why it stopped, and ``summary.json``'s shape.

The synchronous, stale-synchronous and full-batch L-BFGS engines all end a run
with a :class:`StopReason` and describe it with one :class:`RunSummary`, so
the reports, the Python API and outside checks read the same keys whichever
engine ran. A key that does not apply to an engine is written as null
(``function_evaluations`` of an SGD run, ``learning_rate`` of L-BFGS).
The rows of ``rounds.csv`` are :func:`~.run_files.round_fields`, with the
engine's own columns after them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mpi_trainer.persistence.preemption import Preemption


class StopReason(str, Enum):
    """Why a run ended (``summary.json`` ``stop_reason``)."""

    RUNNING = "running"
    EPOCHS = "epochs"
    EARLY_STOPPING = "early_stopping"
    NAN = "nan"
    DIVERGED = "diverged"  # train.divergence = "stop": finite, but the loss climbed or accuracy fell to chance
    MAX_STEPS = "max_steps"
    CALLBACK = "callback"  # a Keras callback set model.stop_training
    PREEMPTED = "preempted"  # a preemption signal: checkpointed, resumed by running the job again
    # full-batch L-BFGS only
    CONVERGED = "converged"  # lbfgs.gtol or lbfgs.ftol was reached
    MAX_EVALUATIONS = "max_evaluations"
    ABNORMAL = "abnormal"  # SciPy's line search gave up

    __str__ = str.__str__


# These stops keep the best round's weights rather than the last round's.
KEEPS_BEST = (StopReason.EARLY_STOPPING, StopReason.NAN, StopReason.DIVERGED)
# A run that stopped for one of these is not complete: running the job again carries it on.
UNFINISHED = (StopReason.RUNNING, StopReason.PREEMPTED)


@dataclass(frozen=True)
class RunContext:
    """What the job knows of a run before its scheduler engine is built, given to the engine with it:
    every rank's host, backend and device (summary.json), the model's and data's fingerprint
    (checkpoints), the Keras callbacks of :func:`mpi_trainer.fit` with the epoch they count from
    (None: no Keras callbacks run, and no History is kept), and the job's preemption state, which its
    signal handlers set (None: no signal reaches this run)."""

    placement: tuple[Mapping[str, Any], ...] = ()
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    callbacks: tuple[Any, ...] | None = None
    initial_epoch: int = 0
    preemption: Preemption | None = None


NO_CONTEXT = RunContext()  # a run built without a job around it (frozen, so one serves every such run)


@dataclass
class RunState:
    """What the scheduler knows about the run so far (carried over a resume by the checkpoint)."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    traffic_bytes: int = 0
    stop_reason: StopReason = StopReason.RUNNING
    steps: int = 0  # optimizer steps; under L-BFGS, function evaluations
    lr_scale: float = 1.0
    wall_offset: float = 0.0
    consecutive_rollbacks: int = 0
    checkpoint_bytes: int = 0
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    divergence: dict[str, Any] | None = None  # the round a finite divergence was confirmed, and its cause


def is_scored(row: Mapping[str, Any]) -> bool:
    """Whether the round was evaluated (``evaluation.every`` leaves the others' test columns NaN; the
    loss is there whenever it was, even for a model without accuracy)."""
    return not math.isnan(float(row["test_loss"]))


def best_test_accuracy(rounds: Sequence[Mapping[str, Any]]) -> float | None:
    """The highest test accuracy of the scored rounds (NaN, a model without accuracy, is skipped)."""
    values = [row["test_accuracy"] for row in rounds if is_scored(row)]
    return max((value for value in values if value == value), default=None)


@dataclass
class RunSummary:
    """``summary.json``: the run so far (rewritten during the run) or as it ended."""

    rounds_completed: int
    final_round: int | None
    final_test_accuracy: float | None
    final_test_loss: float | None
    final_train_loss: float | None
    best_test_accuracy: float | None
    metrics: list[str]
    monitor: str
    best_value: float | None
    best_round: int
    wall_seconds: float
    steps: int
    learning_rate: float | None
    rollbacks: list[dict[str, Any]]
    resumed_after_round: int | None
    traffic_bytes: int
    checkpoint_bytes: int
    model_bytes: int
    stop_reason: StopReason
    workers: int
    optimizer: str
    aggregation: str
    outer_optimizer: str
    ssp: int
    scheduler_wait_seconds: float
    scheduler_wait_cpu_seconds: float
    dataset: str
    placement: list[dict[str, Any]]
    # ``final_test_<name>`` of every compiled metric
    final_test_metrics: dict[str, float | None] = field(default_factory=dict)
    # fault.survive: each worker lost during the run (its rank, host and when), never under L-BFGS
    lost_workers: list[dict[str, Any]] = field(default_factory=list)
    # train.divergence: {"round", "cause", "action"} of a finite divergence seen, else None
    divergence: dict[str, Any] | None = None
    # full-batch L-BFGS: evaluations of loss and gradient, SciPy's last message, float64 vector size
    function_evaluations: int | None = None
    optimizer_message: str | None = None
    parameter_bytes: int | None = None

    @property
    def completed(self) -> bool:
        """The run has ended (not preempted): running the same job again trains nothing more."""
        return StopReason(self.stop_reason) not in UNFINISHED

    @property
    def scheduler_wait_cpu_fraction(self) -> float:
        """CPU seconds the scheduler burned while it waited, per second waited (0 = it slept)."""
        wall = self.scheduler_wait_seconds
        return self.scheduler_wait_cpu_seconds / wall if wall else 0.0

    def as_dict(self) -> dict[str, Any]:
        """What summary.json holds: the fields, ``final_test_<name>`` flattened, the wait fraction."""
        out = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        out.update({f"final_test_{name}": value for name, value in out.pop("final_test_metrics").items()})
        out["stop_reason"] = str(self.stop_reason)
        out["scheduler_wait_cpu_fraction"] = self.scheduler_wait_cpu_fraction
        out["completed"] = self.completed
        return out


def final_columns(final: Mapping[str, Any], metric_names: Sequence[str]) -> dict[str, Any]:
    """The kept round's ``final_*`` values (all None before the first round)."""
    return {"final_round": final.get("round"), "final_test_accuracy": final.get("test_accuracy"),
            "final_test_loss": final.get("test_loss"), "final_train_loss": final.get("train_loss"),
            "final_test_metrics": {name: final.get(f"test_{name}") for name in metric_names}}
