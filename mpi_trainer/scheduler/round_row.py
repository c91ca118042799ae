"""A round as an engine closes it, the rounds.csv row made of it, and what the engine hands the recorder.

:class:`ClosedRound` is a round's results as its engine collected them; :func:`round_row` makes the
row of it; :class:`FinishedRound` is the scored round with its row, which the recorder writes;
:class:`EngineState` is what only the engine knows of a checkpoint (the workers' optimizer states,
the outer optimizer's state), handed over already gathered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from mpi_trainer.comm.messages import Report
from mpi_trainer.persistence.checkpoint import CheckpointArray
from mpi_trainer.persistence.run_files import BUILT_IN_METRICS
from mpi_trainer.persistence.run_record import StopReason


class Retry(Enum):
    """A round's outcome that is not a stop: run the same round again (after a NaN rollback)."""

    ROUND = "retry"


# What closing a round decides: stop (why), run it again, or go on (None).
Outcome = StopReason | Retry | None


@dataclass
class ClosedRound:
    """A round's results as an engine hands them over: reports in rank order, bytes, seconds."""

    index: int
    reports: list[Report]
    bytes: int
    aggregate_seconds: float
    winner: int = -1
    elected: Report | None = None  # best under SSP: the winning update (its worker may have sent two)
    max_staleness: int = 0


@dataclass
class FinishedRound:
    """A round the engine has scored (when due) and timed: its rounds.csv row and the weights it ended with.
    ``preempt``: a worker's report said it was signalled; ``model_holds``: rank 0's Keras model holds
    ``weights`` already (its own evaluation loaded them)."""

    index: int
    row: dict[str, Any]
    weights: np.ndarray
    scored: bool = True
    preempt: bool = False
    model_holds: bool = False


@dataclass
class EngineState:
    """What a checkpoint holds from the engine's side: each worker's optimizer vector (by rank; the
    engine may hand over a mapping that asks each worker for its vector when it is read) and the outer
    optimizer's named arrays."""

    optimizer_states: Mapping[int, CheckpointArray] = field(default_factory=dict)
    outer_arrays: dict[str, np.ndarray] = field(default_factory=dict)


def train_metrics(reports: list[Report], names: list[str]) -> dict[str, float]:
    """``train_<name>``: each metric of the workers' local training, weighted by their samples
    (a report without the metric, e.g. from a worker that ran no step, is left out)."""
    out: dict[str, float] = {}
    for name in names:
        pairs = [(r.train_metrics[name], r.samples) for r in reports if name in r.train_metrics]
        total = sum(samples for _, samples in pairs)
        out[f"train_{name}"] = sum(v * n for v, n in pairs) / total if total else math.nan
    return out


def round_row(closed: ClosedRound, evaluation: dict[str, float], metric_names: list[str], workers: int,
              sync_every: int, discarded_bytes: int) -> dict[str, Any]:
    """One row of rounds.csv, but for the engine's timing columns (``discarded_bytes``: the traffic of
    rounds rolled back since the last recorded one, counted with this one)."""
    reports = closed.reports
    train_times = [r.train_seconds for r in reports]
    samples = sum(r.samples for r in reports)
    names = dict.fromkeys([*BUILT_IN_METRICS, *metric_names])  # the fixed columns are always filled
    row: dict[str, Any] = {f"{split}_{name}": math.nan for name in names for split in ("test", "val", "train")}
    row.update(train_metrics(reports, metric_names))
    row.update({
        "round": closed.index, "train_seconds_max": max(train_times), "train_seconds_min": min(train_times),
        "sync_every": sync_every,
        "aggregate_seconds": closed.aggregate_seconds, "bytes": closed.bytes + discarded_bytes,
        "max_staleness": closed.max_staleness, "samples": samples, "workers": workers,
        "train_loss": sum(r.train_loss * r.samples for r in reports) / samples,
        "learning_rate": _mean_finite([r.learning_rate for r in reports]),
        "winner": closed.winner if closed.winner >= 0 else "",
        # one value per worker, by rank (under SSP the sum of its updates merged in the window)
        "worker_train_seconds": ";".join(f"{sum(r.train_seconds for r in reports if r.rank == w):.4g}"
                                         for w in range(1, workers + 1)),
    })
    if closed.winner >= 0:
        best = closed.elected or next(r for r in reports if r.rank == closed.winner)
        row.update(val_loss=best.val_loss, val_accuracy=best.val_accuracy)
        row.update({f"val_{name}": value for name, value in best.val_metrics.items()})
    row.update(evaluation)
    return row


def _mean_finite(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
