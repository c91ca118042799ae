"""Aggregation rules, as pure functions over flat float32 weight vectors.

Under synchronous rounds ``average`` and ``weighted`` travel as one MPI
reduction: each worker multiplies its weights by :func:`contribution_scale`
before the sum, so the reduced buffer is already the aggregate. ``combine`` is
the same rule applied in one place. Best-of election ranks candidates with
:func:`election_key`, in synchronous rounds and SSP windows alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def contribution_scale(method: str, samples: int, total_samples: int, workers: int) -> float:
    """A worker's share of the aggregate: ``1/W`` (``average``) or ``n_w / N`` (``weighted``).

    ``total_samples`` is what all workers trained on in that round (blocks plus
    increment draws, :func:`mpi_trainer.data.increment.round_samples`), so the
    shares of a round sum to 1. Synchronous workers scale their weights by it
    before the sum-reduction; SSP scales each merged update by it.
    """
    if method == "average":
        return 1.0 / workers
    if method == "weighted":
        if total_samples <= 0:
            raise ValueError(f"total_samples must be > 0. Received: total_samples={total_samples}")
        return samples / total_samples
    raise ValueError(f"method must be 'average' or 'weighted'. Received: method={method!r}")


def combine(vectors: Sequence[np.ndarray], samples: Sequence[int], method: str) -> np.ndarray:
    """Average (``average``) or sample-weighted average (``weighted``) of ``vectors``."""
    if len(vectors) != len(samples) or not vectors:
        raise ValueError(f"need one sample count per vector. Received: {len(vectors)} vectors, "
                         f"{len(samples)} counts")
    total = int(sum(samples))
    out = np.zeros_like(vectors[0], dtype=np.float32)
    for vector, count in zip(vectors, samples):
        out += np.float32(contribution_scale(method, count, total, len(vectors))) * vector
    return out


def election_key(accuracy: float, loss: float, rank: int, arrival: int = 0) -> tuple[float, float, int, int]:
    """The one best-of rule, smallest first: highest validation accuracy, then lowest loss, then
    lowest rank, then (a worker that sent two updates in one SSP window) the earlier one. A model
    without an accuracy metric (regression) or a diverged one scores no accuracy, and its loss decides."""
    accuracy = accuracy if math.isfinite(accuracy) else -math.inf
    loss = loss if math.isfinite(loss) else math.inf
    return -accuracy, loss, rank, arrival


def elect(scores: Mapping[int, tuple[float, float]]) -> int:
    """Best-of election over one synchronous round: ``scores`` maps rank -> (accuracy, loss).

    Every run elects the same winner from the same scores (:func:`election_key`).
    """
    if not scores:
        raise ValueError("cannot elect a winner from no scores")
    return min(scores, key=lambda rank: election_key(*scores[rank], rank))


