"""Exponential moving averages kept by several workers, combined as one process would hold them.

A moving average with decay ``a`` (BatchNormalization's ``momentum``, Adam's ``beta_1`` and
``beta_2``, RMSprop's ``rho``...) is updated once per training step: ``m <- a * m + (1 - a) * s``,
where ``s`` is the step's statistic (a batch's mean, a gradient, its square). After ``n`` steps
from ``m0`` on statistics with mean ``s̄`` it holds ``a**n * m0 + (1 - a**n) * s̄``.

In a round, every worker ``w`` starts from the same ``m0`` and makes ``n_w`` of the round's
``N = sum(n_w)`` updates, on its own batches. The plain mean of the workers' averages has moved
as far as ``n`` updates, not ``N``: its start fades as ``a**n`` instead of ``a**N``, so it
converges W times slower in epochs than one process that saw every batch. Instead each worker's
statistic is recovered, ``s̄_w = (m_w - a**n_w * m0) / (1 - a**n_w)``, the statistics are
averaged by the steps that made them, and the result is what one process holds after all ``N``
updates: ``a**N * m0 + (1 - a**N) * sum(n_w * s̄_w) / N``. This is exact for one worker, and for
several when the statistic is stationary over the round (the assumption every moving average
makes already). A linear recursion without the ``(1 - a)`` factor (SGD's momentum,
``v <- a * v - lr * g``) is the same arithmetic, its statistic scaled by ``1 / (1 - a)``.

A running sum (Adagrad's accumulators) combines as ``m0 + sum(m_w - m0)``.

Under SSP each update is merged alone, as it arrives, into a global average that other updates
may have moved since its author started from ``base`` (:func:`merge_update`): its ``n`` steps are
applied to the global average as they moved its own, ``m <- m_w + a**n * (m - base)``, which is
``m_w`` when nothing moved it meanwhile: one process that made the updates in the order they came.

Each worker computes its contribution before the sum (:func:`contribution`), so the combine
costs one reduction and no more traffic than a plain mean; rank 0 finishes it (:func:`combine`).
Arrays are float32 and updated in place.
"""

from __future__ import annotations

import numpy as np

from mpi_trainer.algorithms.passes import CHUNK, chunks


def contribution(final: np.ndarray, start: np.ndarray, steps: int, decay: float) -> None:
    """Worker side, in place in ``start`` (``final`` is only read): ``start`` becomes
    ``n / (1 - a**n) * (final - a**n * start)``, the worker's statistic weighted by its steps ``n`` (zero
    when it made none). A cache-sized chunk at a time, so each array crosses memory once, no temporary."""
    if steps <= 0:
        start[:] = 0.0
        return
    faded = decay ** steps
    if faded >= 1.0:  # a decay of one never moves: nothing to recover
        start[:] = 0.0
        return
    fade, scale = np.float32(-faded), np.float32(steps / (1.0 - faded))
    for begin, end in chunks(start.size):
        piece = start[begin:end]
        piece *= fade
        piece += final[begin:end]
        piece *= scale


def combine(summed: np.ndarray, start: np.ndarray, total_steps: int, decay: float) -> None:
    """Rank 0, in place: ``summed`` (the workers' contributions added) becomes the average one process
    holds after ``total_steps`` updates from ``start``. A cache-sized chunk at a time, as :func:`contribution`."""
    if total_steps <= 0 or decay >= 1.0:
        summed[:] = start
        return
    faded = decay ** total_steps
    fade, scale = np.float32(faded), np.float32((1.0 - faded) / total_steps)
    scratch = np.empty(min(CHUNK, summed.size), np.float32)
    for begin, end in chunks(summed.size):
        piece, faded_start = summed[begin:end], scratch[:end - begin]
        piece *= scale
        np.multiply(start[begin:end], fade, out=faded_start)
        piece += faded_start


def sum_contribution(final: np.ndarray, start: np.ndarray) -> None:
    """Worker side of a running sum, in place in ``start`` (``final`` is only read): what this worker added
    to it."""
    np.subtract(final, start, out=start)


def sum_combine(summed: np.ndarray, start: np.ndarray) -> None:
    """Rank 0's side of a running sum, in place: the start plus every worker's additions."""
    summed += start


def merge_update(into: np.ndarray, local: np.ndarray, base: np.ndarray, steps: int, decay: float) -> None:
    """SSP, in place: one worker's ``steps`` updates from ``base`` (which left it at ``local``) applied to
    the global average ``into``: ``into <- local + a**n * (into - base)``."""
    if steps <= 0:
        return
    into -= base
    into *= np.float32(decay ** steps)
    into += local


def sum_merge(into: np.ndarray, local: np.ndarray, base: np.ndarray) -> None:
    """SSP, in place: one worker's additions to a running sum added to the global sum."""
    into += local
    into -= base
