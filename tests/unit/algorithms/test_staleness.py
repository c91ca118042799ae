"""The SSP staleness clock, merge rules, best-of window and idle accounting, with plain numbers."""

from __future__ import annotations

import heapq

import pytest

from mpi_trainer.algorithms.staleness import (
    StalenessClock,
    idle_fraction,
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


def test_idle_fraction_matches_the_issue_formula():
    # wall 10 s; workers busy 10, 6 and 4 s: (0 + 4 + 6) / (3 * 10)
    assert idle_fraction(10.0, {1: 10.0, 2: 6.0, 3: 4.0}) == pytest.approx(1 / 3)
    assert idle_fraction(10.0, {1: 12.0}) == 0.0
    assert idle_fraction(0.0, {1: 1.0}) == 0.0
