"""Block rebalancing, the straggler config keys and their error messages, without MPI."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from mpi_trainer.algorithms.rebalance import (
    MIN_TIMED_STEPS,
    Measurement,
    Rebalancer,
    bounds_from_sizes,
    proportional_sizes,
)
from mpi_trainer.config import load_config
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import ConfigError
from mpi_trainer.hooks import TestHooks
from mpi_trainer.trainer.slowdown import make_slowdown


def covers_once(bounds: list[tuple[int, int]], total: int) -> bool:
    return bounds[0][0] == 0 and bounds[-1][1] == total and all(
        a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:] + [(total, total + 1)]))


def test_proportional_sizes_sum_to_total_and_follow_the_weights():
    assert proportional_sizes(900, [2.0, 1.0]) == [600, 300]
    sizes = proportional_sizes(1001, [3.0, 1.0, 1.0])
    assert sum(sizes) == 1001 and sizes[0] == pytest.approx(600, abs=1)
    assert proportional_sizes(3, [1000.0, 1.0, 1.0]) == [1, 1, 1]
    with pytest.raises(ValueError, match="need at least one sample per block"):
        proportional_sizes(1, [1.0, 1.0])


def test_a_half_speed_worker_gets_a_third_after_the_warm_up_round():
    rebalancer = Rebalancer([(0, 600), (600, 1200)], smoothing=1.0)
    assert not rebalancer.update({0: (600, 9.0), 1: (600, 30.0)})  # warm-up round: not measured
    assert rebalancer.update({0: (600, 1.0), 1: (600, 2.0)})
    assert rebalancer.bounds == [(0, 800), (800, 1200)]
    assert covers_once(rebalancer.bounds, 1200)


def test_measured_step_rates_recut_the_blocks_after_the_first_round():
    # Round 0's train seconds are mostly tracing (9 s and 30 s); the steady steps say 2:1.
    rebalancer = Rebalancer([(0, 600), (600, 1200)], smoothing=0.5)
    assert rebalancer.update({0: Measurement(600, 9.0, step_rate=1000.0, timed_steps=15),
                              1: Measurement(600, 30.0, step_rate=500.0, timed_steps=15)})
    assert rebalancer.bounds == [(0, 800), (800, 1200)]  # the first measurement is taken whole
    assert covers_once(rebalancer.bounds, 1200)
    # Near-equal rates stay inside the deadband: the blocks do not move by a few samples.
    rebalancer = Rebalancer([(0, 600), (600, 1200)], smoothing=0.5)
    assert not rebalancer.update({0: Measurement(600, 1.0, 1000.0, 15), 1: Measurement(600, 1.0, 1015.0, 15)})


def test_a_step_rate_from_too_few_steps_waits_for_a_second_round_of_round_throughput():
    rebalancer = Rebalancer([(0, 600), (600, 1200)], smoothing=1.0)
    few = MIN_TIMED_STEPS - 1
    assert not rebalancer.update({0: Measurement(600, 9.0, 1000.0, few), 1: Measurement(600, 30.0, 500.0, few)})
    assert rebalancer.update({0: Measurement(600, 1.0, 9999.0, few), 1: Measurement(600, 3.0, 1.0, few)})
    assert rebalancer.bounds == [(0, 900), (900, 1200)]  # 600/1 against 600/3 samples/s: 3:1


def test_step_rates_reach_the_split_a_per_round_overhead_hides_from_round_throughput():
    # Both workers equally fast (1000 samples/s) plus 1 s of per-round overhead each: the whole
    # call's rate makes the smaller block look slower, so a re-cut goes only part of the way.
    rebalancer = Rebalancer([(0, 800), (800, 1200)], smoothing=1.0)
    rebalancer.update({0: (800, 1.8), 1: (400, 1.4)})  # warm-up of the whole-call path
    assert rebalancer.update({0: (800, 1.8), 1: (400, 1.4)})
    assert rebalancer.bounds[1][1] - rebalancer.bounds[1][0] < 500
    measured = Rebalancer([(0, 800), (800, 1200)], smoothing=1.0)
    assert measured.update({0: Measurement(800, 1.8, 1000.0, 20), 1: Measurement(400, 1.4, 1000.0, 10)})
    assert measured.bounds == [(0, 600), (600, 1200)]  # equal speeds: equal blocks


def test_one_stalled_round_is_ignored_and_a_lasting_slowdown_is_followed():
    rebalancer = Rebalancer([(0, 500), (500, 1000)], smoothing=0.5)
    rebalancer.update({0: (500, 9.0), 1: (500, 9.0)})  # warm-up
    for _ in range(3):
        assert not rebalancer.update({0: (500, 1.0), 1: (500, 1.0)})
    assert not rebalancer.update({0: (500, 1.0), 1: (500, 3.0)})  # worker 1 stalls once
    for _ in range(2):
        assert not rebalancer.update({0: (500, 1.0), 1: (500, 1.0)})  # and is back to speed
    assert rebalancer.bounds == [(0, 500), (500, 1000)]
    # Worker 1 becomes 3x slower for good: followed from its second slow round on.
    assert not rebalancer.update({0: (500, 1.0), 1: (500, 3.0)})
    assert rebalancer.update({0: (500, 1.0), 1: (500, 3.0)})
    moved = rebalancer.bounds[0][1] - 500
    assert 0 < moved < 1000 * 3 / 4 - 500  # the moving average approaches 3:1 without overshooting
    assert covers_once(rebalancer.bounds, 1000)


def test_blocks_converge_to_equal_train_times_and_then_stay_still():
    rebalancer = Rebalancer([(0, 500), (500, 1000)], smoothing=0.5)
    seconds_per_sample = [1 / 500, 2 / 500]  # worker 1 at half speed
    rebalancer.update({0: (500, 9.0), 1: (500, 9.0)})  # warm-up
    changes = []
    for _ in range(20):
        sizes = [e - s for s, e in rebalancer.bounds]
        changes.append(rebalancer.update({i: (n, n * t) for i, (n, t) in
                                          enumerate(zip(sizes, seconds_per_sample))}))
    settled = [e - s for s, e in rebalancer.bounds]
    assert abs(settled[0] - 667) <= 0.03 * 667 and covers_once(rebalancer.bounds, 1000)
    assert any(changes) and not any(changes[-10:])  # settles instead of moving every round


def test_bounds_from_sizes_are_contiguous():
    assert bounds_from_sizes([3, 1, 2]) == [(0, 3), (3, 4), (4, 6)]


def test_rebalancer_rejects_a_bad_smoothing():
    with pytest.raises(ValueError, match="smoothing must lie in"):
        Rebalancer([(0, 2)], smoothing=0.0)


@pytest.mark.parametrize(("override", "message"), [
    ("debug.slow_factor=0.5", "`debug.slow_factor` must be >= 1 (1 = normal speed). "
                              "Received: debug.slow_factor=0.5"),
    ("debug.batch_delay=-0.1", "`debug.batch_delay` must be >= 0. Received: debug.batch_delay=-0.1"),
    ("debug.slow_ranks=[0]", "`debug.slow_ranks` must list worker ranks (each >= 1; rank 0 is the "
                             "scheduler). Received: debug.slow_ranks=[0]"),
    ("data.rebalance_smoothing=1.5", "`data.rebalance_smoothing` must lie in the interval (0, 1]. "
                                     "Received: data.rebalance_smoothing=1.5"),
    ("data.rebalance=1", "`data.rebalance` must be of type bool. Received: data.rebalance=1"),
    ("aggregation.ssp=-1", "`aggregation.ssp` must be >= 0. Received: aggregation.ssp=-1"),
])
def test_bad_straggler_keys_name_key_value_and_expectation(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert str(info.value) == message


def test_slow_ranks_must_exist_in_the_job():
    TestHooks(slow_ranks=[1, 2], slow_factor=2.0).check_slow_ranks(world_size=3)
    with pytest.raises(ConfigError, match=r"must name worker ranks 1..2 of this 3-rank job. "
                                          r"Received: debug.slow_ranks=\[3\]"):
        TestHooks(slow_ranks=[3], slow_factor=2.0).check_slow_ranks(world_size=3)


def test_slowdown_is_absent_unless_configured_for_this_rank():
    assert make_slowdown(TestHooks(), 1) is None
    assert make_slowdown(TestHooks(slow_ranks=[2], slow_factor=2.0), 1) is None
    assert make_slowdown(TestHooks(slow_ranks=[2], slow_factor=1.0), 2) is None
    assert make_slowdown(TestHooks(slow_ranks=[2], slow_factor=2.0), 2) is not None
    assert make_slowdown(TestHooks(slow_ranks=[2], batch_delay=0.01), 1).factor == 1.0  # delay only
    assert make_slowdown(TestHooks(slow_ranks=[2], slow_factor=3.0, batch_delay=0.01), 2).factor == 3.0


def test_slowdown_makes_each_batch_and_its_delay_take_factor_times_as_long():
    import keras

    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    slowdown = make_slowdown(TestHooks(slow_ranks=[1], slow_factor=3.0, batch_delay=0.01), 1)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[slowdown])  # first batch traces
    slowdown.slept_seconds = slowdown.slowed_batch_seconds = 0.0
    started = time.perf_counter()
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[slowdown])
    elapsed = time.perf_counter() - started
    assert slowdown.batches_seen == 16
    # each of the second fit's 8 batches is followed by a pause that makes batch + 10 ms take 3x as long
    expected = 8 * 0.01 + 2 * (slowdown.slowed_batch_seconds + 8 * 0.01)
    assert slowdown.slept_seconds == pytest.approx(expected, rel=1e-6)
    assert elapsed >= slowdown.slept_seconds + slowdown.slowed_batch_seconds > 0


def test_rebalancing_with_scatter_placement_is_accepted():
    cfg = load_config(None, ["data.rebalance=true", "data.placement='scatter'"])
    assert cfg.data.rebalance and cfg.data.placement == "scatter"


@pytest.mark.parametrize("override, message", [
    ("train.max_steps=100", "Received: aggregation.ssp=1, train.max_steps=100"),
    ("train.nan_policy='rollback'", "Received: aggregation.ssp=1, train.nan_policy='rollback'"),
])
def test_synchronous_only_features_are_refused_under_ssp(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["aggregation.ssp=1", override])


@pytest.mark.parametrize("overrides, received", [
    (["aggregation.ssp=0"], "aggregation.ssp=0 and aggregation.method='average'"),
    (["aggregation.ssp=1", "aggregation.method='best'"], "aggregation.ssp=1 and aggregation.method='best'"),
])
def test_staleness_damping_where_it_would_do_nothing_is_refused(overrides, received):
    with pytest.raises(ConfigError, match=f"Received: aggregation.staleness_damping=True with {received}"):
        load_config(None, ["aggregation.staleness_damping=true", *overrides])
    load_config(None, ["aggregation.staleness_damping=true", "aggregation.ssp=1"])  # merged updates: fine


def _scatter_setup(*overrides: str):
    """digits, 2 workers with equal blocks, and a re-cut that moves a sixth of the data to rank 1."""


    cfg = load_config(None, ["data.source=digits", "data.rebalance=true", "data.placement='scatter'",
                             "train.epochs=4", *overrides])
    dataset = load_dataset(cfg.data, 0)
    total = dataset.num_train
    plan = SimpleNamespace(num_train=total, shuffle_seed=0, class_weight=None, block_bounds=block_bounds(total, 2),
                           start_round=0)
    recut = SimpleNamespace(**{**vars(plan), "block_bounds": [(0, 2 * total // 3), (2 * total // 3, total)]})
    return cfg, dataset, plan, recut


