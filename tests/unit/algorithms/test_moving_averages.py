"""Moving averages of several workers combined as one process holds them, with plain numbers."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.algorithms import moving_averages


def ema(start: np.ndarray, statistics: list[np.ndarray], decay: float) -> np.ndarray:
    value = start.copy()
    for statistic in statistics:
        value = decay * value + (1 - decay) * statistic
    return value


def combined(start: np.ndarray, finals: list[np.ndarray], steps: list[int], decay: float) -> np.ndarray:
    summed = np.zeros_like(start)
    for final, count in zip(finals, steps):
        part = start.copy()
        moving_averages.contribution(final, part, count, decay)
        summed += part
    moving_averages.combine(summed, start, sum(steps), decay)
    return summed


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9, 0.99, 0.999])
def test_stationary_statistics_give_one_processs_average_after_every_workers_steps(decay):
    start = np.array([0.0, 1.0, -2.0], np.float32)
    statistic = np.array([3.0, 0.25, 5.0], np.float32)
    steps = [4, 7, 1]
    finals = [ema(start, [statistic] * count, decay) for count in steps]
    np.testing.assert_allclose(combined(start, finals, steps, decay), ema(start, [statistic] * 12, decay),
                               rtol=2e-4, atol=2e-5)


def test_one_worker_keeps_its_own_average_whatever_its_statistics():
    rng = np.random.default_rng(0)
    start = rng.normal(size=5).astype(np.float32)
    final = ema(start, list(rng.normal(size=(6, 5)).astype(np.float32)), 0.9)
    np.testing.assert_allclose(combined(start, [final], [6], 0.9), final, rtol=1e-5, atol=1e-6)


def test_a_state_of_several_chunks_combines_as_a_short_one_value_for_value():
    """The passes go a cache-sized chunk at a time: every chunk, the last partial one included, is combined."""
    from mpi_trainer.algorithms.passes import CHUNK

    rng = np.random.default_rng(1)
    size = 2 * CHUNK + 123
    start = rng.normal(size=size).astype(np.float32)
    finals = [ema(start, list(rng.normal(size=(count, size)).astype(np.float32)), 0.9) for count in (3, 5)]
    whole = combined(start, finals, [3, 5], 0.9)
    for begin, end in [(0, 7), (CHUNK - 3, CHUNK + 4), (size - 5, size)]:
        piece = combined(start[begin:end].copy(), [final[begin:end] for final in finals], [3, 5], 0.9)
        np.testing.assert_array_equal(whole[begin:end], piece)


def test_workers_statistics_are_weighted_by_their_steps():
    start = np.zeros(1, np.float32)
    finals = [ema(start, [np.ones(1, np.float32)] * 3, 0.5), ema(start, [np.full(1, 5.0, np.float32)] * 1, 0.5)]
    expected = (1 - 0.5**4) * (3 * 1.0 + 1 * 5.0) / 4
    np.testing.assert_allclose(combined(start, finals, [3, 1], 0.5), [expected], rtol=1e-6)


def test_a_worker_without_steps_adds_nothing_and_no_steps_keep_the_start():
    start = np.array([2.0], np.float32)
    moved = ema(start, [np.zeros(1, np.float32)] * 2, 0.5)
    np.testing.assert_allclose(combined(start, [moved, start.copy()], [2, 0], 0.5), moved, rtol=1e-6)
    np.testing.assert_array_equal(combined(start, [start.copy()], [0], 0.5), start)


def test_running_sums_add_every_workers_additions_to_the_start():
    start = np.array([1.0, 2.0], np.float32)
    finals = [start + 0.5, start + 1.5]
    summed = np.zeros_like(start)
    for final in finals:
        part = start.copy()
        moving_averages.sum_contribution(final, part)
        summed += part
    moving_averages.sum_combine(summed, start)
    np.testing.assert_allclose(summed, start + 2.0)


def test_ssp_merges_in_arrival_order_are_one_process_that_made_the_updates_in_that_order():
    rng = np.random.default_rng(2)
    start = rng.normal(size=4).astype(np.float32)
    first = list(rng.normal(size=(3, 4)).astype(np.float32))
    second = list(rng.normal(size=(5, 4)).astype(np.float32))
    into = start.copy()
    for batches in (first, second):  # both workers started from ``start``; merged as they arrive
        moving_averages.merge_update(into, ema(start, batches, 0.8), start, len(batches), 0.8)
    np.testing.assert_allclose(into, ema(start, first + second, 0.8), rtol=1e-5, atol=1e-6)


def test_an_ssp_merge_onto_the_state_it_started_from_is_the_workers_own_and_sums_add():
    start = np.array([1.0, -2.0], np.float32)
    moved = ema(start, [np.ones(2, np.float32)] * 2, 0.5)
    into = start.copy()
    moving_averages.merge_update(into, moved, start, 2, 0.5)
    np.testing.assert_allclose(into, moved, rtol=1e-6)
    total = np.array([3.0, 3.0], np.float32)
    moving_averages.sum_merge(total, start + 0.5, start)
    np.testing.assert_allclose(total, [3.5, 3.5])
