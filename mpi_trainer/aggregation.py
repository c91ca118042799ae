"""Aggregation rules, as pure functions over flat float32 weight vectors.

Under synchronous rounds ``average`` and ``weighted`` travel as one MPI
reduction: each worker multiplies its weights by :func:`contribution_scale`
before the sum, so the reduced buffer is already the aggregate. ``combine`` is
the same rule applied in one place, used by tests and by the SSP path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def contribution_scale(method: str, samples: int, total_samples: int, workers: int) -> float:
    """The factor a worker applies to its weights before the sum-reduction."""
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


def elect(scores: Mapping[int, tuple[float, float]]) -> int:
    """Best-of election: the rank with the highest validation accuracy.

    ``scores`` maps rank -> (accuracy, loss). Ties go to the lower loss, then
    to the lower rank, so every run elects the same winner from the same scores.
    """
    if not scores:
        raise ValueError("cannot elect a winner from no scores")
    return min(sorted(scores), key=lambda rank: (-scores[rank][0], scores[rank][1]))
