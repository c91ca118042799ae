"""The SSP staleness clock, merge rules, best-of window and idle accounting, with plain numbers."""

from __future__ import annotations

import heapq

import numpy as np
import pytest

from mpi_trainer.algorithms import aggregation
from mpi_trainer.algorithms.aggregation import BestWindow
from mpi_trainer.algorithms.staleness import (
    StalenessClock,
    busy_seconds,
    idle_fraction,
    merge_delta,
    merge_share,
)


def test_bsp_clock_admits_a_worker_only_when_everyone_has_caught_up():
    clock = StalenessClock([1, 2, 3], staleness_bound=0)
    assert all(clock.may_start(w) for w in (1, 2, 3))
    clock.finish(1)
    assert not clock.may_start(1) and clock.may_start(2)
    clock.finish(2)
    clock.finish(3)
    assert clock.slowest == 1 and all(clock.may_start(w) for w in (1, 2, 3))


def test_ssp_clock_lets_a_worker_run_exactly_s_updates_ahead():
    clock = StalenessClock([1, 2], staleness_bound=2)
    for expected_lead in (1, 2):
        clock.finish(1)
        assert clock.lead(1) == expected_lead and clock.may_start(1)
    clock.finish(1)
    assert clock.lead(1) == 3 and not clock.may_start(1)
    clock.finish(2)
    assert clock.may_start(1)


def test_clock_rejects_a_negative_bound():
    with pytest.raises(ValueError, match="staleness_bound must be >= 0. Received: staleness_bound=-1"):
        StalenessClock([1], -1)


def simulate(durations: dict[int, float], bound: int, updates: int) -> list[tuple[int, int]]:
    """Event-driven SSP schedule: returns (worker, staleness at dispatch) per merged update."""
    clock, events, log, now = StalenessClock(list(durations), bound), [], [], 0.0
    waiting = set(durations)

    def dispatch_ready(t: float) -> None:
        for w in sorted(waiting):
            if clock.may_start(w):
                waiting.discard(w)
                heapq.heappush(events, (t + durations[w], w, clock.lead(w)))

    dispatch_ready(now)
    while len(log) < updates:
        now, worker, staleness = heapq.heappop(events)
        clock.finish(worker)
        log.append((worker, staleness))
        waiting.add(worker)
        dispatch_ready(now)
    return log


@pytest.mark.parametrize("bound", [0, 1, 2, 3])
def test_staleness_never_exceeds_the_bound_and_fast_workers_use_it(bound):
    log = simulate({1: 1.0, 2: 1.0, 3: 2.0}, bound, updates=60)
    staleness = [s for _, s in log]
    assert max(staleness) == bound
    fast = sum(1 for w, _ in log if w == 1)
    slow = sum(1 for w, _ in log if w == 3)
    assert fast >= slow
    if bound > 0:
        assert fast > slow


def test_shares_follow_the_synchronous_rule_and_damping_divides_by_one_plus_staleness():
    assert merge_share("average", 10, 100, 4, 0, damping=False) == pytest.approx(0.25)
    assert merge_share("weighted", 30, 100, 2, 3, damping=False) == pytest.approx(0.3)
    assert merge_share("weighted", 30, 100, 2, 2, damping=True) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="staleness must be >= 0"):
        merge_share("average", 1, 2, 2, -1, damping=False)


@pytest.mark.parametrize("method", ["average", "weighted"])
def test_delta_merges_at_s0_equal_the_synchronous_aggregate(method):
    rng = np.random.default_rng(3)
    base = rng.normal(size=50).astype(np.float32)
    locals_ = [base + rng.normal(size=50).astype(np.float32) for _ in range(3)]
    samples = [100, 250, 150]
    merged = base.copy()
    for local, count in zip(locals_, samples):
        merge_delta(merged, local, base, merge_share(method, count, sum(samples), 3, 0, damping=False))
    np.testing.assert_allclose(merged, aggregation.combine(locals_, samples, method), atol=1e-5)


def test_a_stale_update_adds_what_it_learnt_instead_of_dragging_the_model_back():
    old_base = np.array([0.0, 0.0], dtype=np.float32)
    global_weights = np.array([10.0, 10.0], dtype=np.float32)  # others moved on meanwhile
    stale_local = np.array([1.0, -1.0], dtype=np.float32)  # learnt +1 / -1 from the old base
    merge_delta(global_weights, stale_local, old_base, 0.5)
    np.testing.assert_allclose(global_weights, [10.5, 9.5])


def test_best_window_keeps_the_highest_accuracy_then_lowest_loss_then_earliest():
    window = BestWindow()
    assert window.offer(1, 0.80, 0.5, np.array([1.0]))
    assert window.offer(2, 0.90, 0.7, np.array([2.0]))
    assert window.offer(1, 0.90, 0.6, np.array([3.0]))
    assert not window.offer(2, 0.90, 0.6, np.array([4.0]))  # a tie goes to the earlier update
    winner, weights = window.close()
    assert winner == 1 and weights.tolist() == [3.0]
    assert window.close() == (-1, None)


def test_best_window_and_synchronous_election_share_one_rule():
    window = BestWindow()
    window.offer(3, 0.9, 0.25, np.array([3.0]))  # arrives first
    window.offer(2, 0.9, 0.25, np.array([2.0]))  # an exact tie from a lower rank
    assert window.close()[0] == 2 == aggregation.elect({3: (0.9, 0.25), 2: (0.9, 0.25)})


def test_busy_seconds_is_the_union_of_spans_clipped_to_the_window():
    assert busy_seconds([(0, 4), (2, 6), (8, 20)], 1, 10) == pytest.approx(5 + 2)
    assert busy_seconds([(-5, -1)], 0, 10) == 0.0


def test_idle_fraction_matches_the_issue_formula():
    # wall 10 s; workers busy 10, 6 and 4 s: (0 + 4 + 6) / (3 * 10)
    assert idle_fraction(10.0, {1: 10.0, 2: 6.0, 3: 4.0}) == pytest.approx(1 / 3)
    assert idle_fraction(10.0, {1: 12.0}) == 0.0
    assert idle_fraction(0.0, {1: 1.0}) == 0.0
