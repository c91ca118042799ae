"""Dynamic block rebalancing: re-cut worker blocks in proportion to measured throughput.

Pure Python, driven by the scheduler between synchronous rounds. Each round a
worker's throughput is its block size over its train time. Two filters keep
noise from moving the blocks:

* the median of the worker's last ``WINDOW`` measurements, so that one round
  in which a worker stalled (another job took its core, the OS swapped) is
  ignored, while a lasting change of speed is followed from its second round;
* an exponential moving average of those medians (``smoothing`` = weight of
  the newest), so that the blocks approach a new split without overshooting.

Blocks are only re-cut when some block would change by more than ``DEADBAND``
of its size, so that they settle instead of shifting by a few samples every
round. A worker's first round is not measured: it includes one-time set-up
(graph tracing) that says nothing about its speed. The blocks always stay
contiguous, non-empty and cover the training set exactly once.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence

DEADBAND = 0.02
WINDOW = 3


def proportional_sizes(total: int, weights: Sequence[float]) -> list[int]:
    """Integer sizes >= 1 summing to ``total``, proportional to ``weights`` (largest remainder)."""
    count = len(weights)
    if count < 1 or total < count:
        raise ValueError(f"need at least one sample per block. Received: total={total}, blocks={count}")
    if any(w <= 0 for w in weights):
        raise ValueError(f"weights must be > 0. Received: weights={list(weights)}")
    spare, weight_sum = total - count, float(sum(weights))
    exact = [spare * w / weight_sum for w in weights]
    sizes = [1 + int(e) for e in exact]
    by_remainder = sorted(range(count), key=lambda i: (-(exact[i] - int(exact[i])), i))
    for index in by_remainder[: total - sum(sizes)]:
        sizes[index] += 1
    return sizes


def bounds_from_sizes(sizes: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


class Rebalancer:
    """Smoothed per-worker throughput and the block plan it implies."""

    def __init__(self, bounds: Sequence[tuple[int, int]], smoothing: float) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must lie in (0, 1]. Received: smoothing={smoothing}")
        self.bounds = [tuple(b) for b in bounds]
        self.smoothing = smoothing
        self.throughput: list[float | None] = [None] * len(self.bounds)
        self.recent: list[deque[float]] = [deque(maxlen=WINDOW) for _ in self.bounds]
        self.warmed_up = [False] * len(self.bounds)

    @property
    def total(self) -> int:
        return self.bounds[-1][1] - self.bounds[0][0]

    def observe(self, index: int, samples: int, train_seconds: float) -> None:
        """Fold one round's measurement for block ``index`` into its smoothed throughput."""
        if not self.warmed_up[index]:
            self.warmed_up[index] = True
            return
        if samples <= 0 or train_seconds <= 0:
            return
        self.recent[index].append(samples / train_seconds)
        rate = statistics.median(self.recent[index])
        old = self.throughput[index]
        self.throughput[index] = rate if old is None else self.smoothing * rate + (1 - self.smoothing) * old

    def propose(self) -> list[tuple[int, int]]:
        """The next round's bounds; unchanged until every worker has been measured."""
        if any(rate is None for rate in self.throughput):
            return list(self.bounds)
        sizes = proportional_sizes(self.total, [float(rate) for rate in self.throughput])
        current = [end - start for start, end in self.bounds]
        if all(abs(new - old) <= DEADBAND * old for new, old in zip(sizes, current)):
            return list(self.bounds)
        return bounds_from_sizes(sizes)

    def update(self, measurements: Mapping[int, tuple[int, float]]) -> bool:
        """Observe ``{block index: (samples, train_seconds)}``; returns True when the blocks changed."""
        for index, (samples, seconds) in sorted(measurements.items()):
            self.observe(index, samples, seconds)
        proposed = self.propose()
        changed = proposed != self.bounds
        self.bounds = proposed
        return changed
