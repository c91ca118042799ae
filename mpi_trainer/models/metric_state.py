"""Evaluation, and the metric-state arithmetic that lets workers score shards of a split.

Each worker sums its shard's metric state (the metrics' variables); the sums add up across
workers to the state of the whole split, from which the metrics are read exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def evaluate_model(model: Any, x: Any, y: Any, batch_size: int) -> dict[str, float]:
    """Loss and metrics of ``model`` on ``(x, y)``, as ``model.evaluate`` gives them, at a fraction of its cost.

    ``model.evaluate`` sets up a data adapter, callbacks and a progress loop on
    every call, about 0.1 s, which the scheduler pays every round while the
    workers wait. ``test_on_batch`` runs the same compiled test step on one
    batch (after resetting the metrics); the metrics' states of all batches are
    summed, which is exact for every metric whose state is a sum (means, counts,
    confusion counts such as AUC's), and the result is read from the sum.
    """
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty split")
    return metrics_from_state(model, summed_metric_state(model, x, y, batch_size))


def summed_metric_state(model: Any, x: Any, y: Any, batch_size: int) -> list[np.ndarray]:
    """The compiled metrics' state summed over the batches of ``(x, y)``; zeros when it has no rows.

    States of disjoint shards add up to the state of their union, which is how
    workers that each score a shard of a split give the exact result together.
    """
    total: list[np.ndarray] | None = None
    for start in range(0, len(x), batch_size):
        model.test_on_batch(x[start:start + batch_size], y[start:start + batch_size])
        count_rows(output_losses(model), len(x[start:start + batch_size]))
        state = metric_state(model)  # of this batch alone: test_on_batch resets the metrics first
        total = state if total is None else [a + b for a, b in zip(total, state)]
    if total is None:  # no rows; a model that has scored before has built all its metrics
        model.reset_metrics()
        total = [np.zeros_like(state) for state in metric_state(model)]
    return total


def output_losses(model: Any) -> list[Any]:
    """A multi-output model's per-output loss trackers (``<output>_loss``; none for one output)."""
    return list(getattr(getattr(model, "_compile_loss", None), "metrics", None) or [])


def count_rows(trackers: list[Any], rows: int) -> None:
    """Make each tracker's state of one batch count the batch's rows.

    Keras weights a per-output loss by the batch's static size, which a traced step often does not
    know, and then counts the batch once: summed over batches that would weight a short last batch
    (or a worker's short shard) like a full one. Counting rows makes the sums means over the samples.
    """
    for tracker in trackers:
        total, count = tracker.variables  # a Mean's (total, count): of this batch's mean loss alone
        if float(count.numpy()) > 0:
            total.assign(total.numpy() / count.numpy() * rows)
            count.assign(np.asarray(rows, dtype=count.dtype))


def metric_state(model: Any) -> list[np.ndarray]:
    """The compiled metrics' variables (the loss tracker's included), as NumPy arrays."""
    return [np.asarray(variable.numpy()) for metric in model.metrics for variable in metric.variables]


def flat_metric_state(state: list[np.ndarray]) -> np.ndarray:
    """Metric state as one float64 vector, for a sum-reduction over MPI."""
    return np.concatenate([np.ravel(part).astype(np.float64) for part in state])


def metrics_from_flat(model: Any, vector: np.ndarray) -> dict[str, float]:
    """Every metric of ``model`` read from a summed :func:`flat_metric_state` vector."""
    shapes = [np.shape(part) for part in metric_state(model)]
    ends = np.cumsum([int(np.prod(shape)) for shape in shapes])
    if not ends.size or ends[-1] != vector.size:
        raise ValueError(f"metric state of {vector.size} values does not fit this model's metrics "
                         f"({int(ends[-1]) if ends.size else 0} values)")
    parts = np.split(vector, ends[:-1])
    return metrics_from_state(model, [part.reshape(shape) for part, shape in zip(parts, shapes)])


def metrics_from_state(model: Any, state: list[np.ndarray]) -> dict[str, float]:
    """Load summed metric variables back into ``model`` and read every metric's result."""
    variables = [variable for metric in model.metrics for variable in metric.variables]
    for variable, value in zip(variables, state, strict=True):
        variable.assign(value)
    return {name: float(np.asarray(value)) for name, value in model.get_metrics_result().items()}
