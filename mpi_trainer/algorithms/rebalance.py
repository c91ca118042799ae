"""Dynamic block rebalancing: re-cut worker blocks in proportion to measured speed.

Pure Python, driven by the scheduler between synchronous epochs. A worker's
speed is, when its measurement carries one, the rate of its steady training
steps (``Measurement.step_rate``, samples per second without its first steps'
tracing); otherwise its block size over its train time (what the scheduler
measures today: each worker's rows and seconds of the epoch). Two filters keep noise from
moving the blocks:

* the median of the worker's last ``WINDOW`` measurements, so that one round
  in which a worker stalled (another job took its core, the OS swapped) is
  ignored, while a lasting change of speed is followed from its second round;
* an exponential moving average of those medians (``smoothing`` = weight of
  the newest), so that the blocks approach a new split without overshooting.

Blocks are only re-cut when some block would change by more than ``DEADBAND``
of its size, so that they settle instead of shifting by a few samples every
round. A step rate timed over at least ``MIN_TIMED_STEPS`` steps counts from
the worker's first round, so the blocks can change from round 1 on. Without
one, a worker's first round is not measured: its train time includes one-time
set-up (graph tracing) that says nothing about its speed. The blocks always
stay contiguous, non-empty and cover the training set exactly once.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

DEADBAND = 0.02
WINDOW = 3
MIN_TIMED_STEPS = 5


@dataclass(frozen=True)
class Measurement:
    """One training call of one worker: its samples and seconds, and its step rate when it timed steps."""

    samples: int
    seconds: float
    step_rate: float | None = None
    timed_steps: int = 0


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


class TimedReport(Protocol):
    """What a worker's report (:class:`~mpi_trainer.comm.messages.Report`) says about its speed."""

    @property
    def samples(self) -> int: ...

    @property
    def train_seconds(self) -> float: ...

    @property
    def step_rate(self) -> float | None: ...

    @property
    def timed_steps(self) -> int: ...


def measured(report: TimedReport) -> Measurement:
    """What a worker's report (:class:`~mpi_trainer.comm.messages.Report`) says about its speed."""
    return Measurement(report.samples, report.train_seconds, report.step_rate, report.timed_steps)


class Rebalancer:
    """Smoothed per-worker throughput and the block plan it implies."""

    def __init__(self, bounds: Sequence[tuple[int, int]], smoothing: float) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must lie in (0, 1]. Received: smoothing={smoothing}")
        self.bounds = [(start, end) for start, end in bounds]
        self.smoothing = smoothing
        self.throughput: list[float | None] = [None] * len(self.bounds)
        self.recent: list[deque[float]] = [deque(maxlen=WINDOW) for _ in self.bounds]
        self.warmed_up = [False] * len(self.bounds)

    @property
    def total(self) -> int:
        return self.bounds[-1][1] - self.bounds[0][0]

    def observe(self, index: int, measurement: Measurement) -> None:
        """Fold one measurement for block ``index`` into its smoothed throughput."""
        rate = self.rate_of(index, measurement)
        if rate is None:
            return
        self.recent[index].append(rate)
        rate = statistics.median(self.recent[index])
        old = self.throughput[index]
        self.throughput[index] = rate if old is None else self.smoothing * rate + (1 - self.smoothing) * old

    def rate_of(self, index: int, measurement: Measurement) -> float | None:
        """Samples per second: the step rate when timed over enough steps, else the whole call's.

        A step rate leaves tracing out, so it counts from the first round; the
        whole call's rate does not, so a worker's first one is skipped.
        """
        warmed_up, self.warmed_up[index] = self.warmed_up[index], True
        if measurement.step_rate is not None and measurement.timed_steps >= MIN_TIMED_STEPS:
            return measurement.step_rate if measurement.step_rate > 0 else None
        if not warmed_up or measurement.samples <= 0 or measurement.seconds <= 0:
            return None
        return measurement.samples / measurement.seconds

    def propose(self) -> list[tuple[int, int]]:
        """The next round's bounds; unchanged until every worker has been measured."""
        rates = [float(rate) for rate in self.throughput if rate is not None]
        if len(rates) < len(self.throughput):
            return list(self.bounds)
        sizes = proportional_sizes(self.total, rates)
        current = [end - start for start, end in self.bounds]
        if all(abs(new - old) <= DEADBAND * old for new, old in zip(sizes, current)):
            return list(self.bounds)
        return bounds_from_sizes(sizes)

    def describe(self, workers: Sequence[int]) -> str:
        """For the log: the smoothed rates and the block sizes, e.g. ``(1200, 600 samples/s): rank 1: 862, ...``."""
        rates = ", ".join(f"{rate:.0f}" for rate in self.throughput if rate is not None)
        sizes = ", ".join(f"rank {w}: {end - start}" for w, (start, end) in zip(workers, self.bounds))
        return f"({rates} samples/s): {sizes}"

    def update(self, measurements: Mapping[int, Measurement | tuple[int, float]]) -> bool:
        """Observe ``{block index: measurement}`` (or ``(samples, seconds)``); True when the blocks changed."""
        for index, measurement in sorted(measurements.items()):
            if not isinstance(measurement, Measurement):
                measurement = Measurement(*measurement)
            self.observe(index, measurement)
        proposed = self.propose()
        changed = proposed != self.bounds
        self.bounds = proposed
        return changed
