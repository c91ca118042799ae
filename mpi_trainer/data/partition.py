"""Cutting the training set into per-worker blocks."""

from __future__ import annotations


def block_bounds(num_samples: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` blocks covering ``num_samples``; sizes differ by at most one."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1. Received: workers={workers}")
    if num_samples < workers:
        raise ValueError(f"need at least one training sample per worker. Received: "
                         f"{num_samples} samples for {workers} workers")
    base, extra = divmod(num_samples, workers)
    bounds, start = [], 0
    for index in range(workers):
        end = start + base + (1 if index < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def shard(rows: int, index: int, count: int) -> slice:
    """Part ``index`` of ``count`` contiguous, near-equal parts of ``rows`` rows (empty when rows < count)."""
    return slice(rows * index // count, rows * (index + 1) // count)


