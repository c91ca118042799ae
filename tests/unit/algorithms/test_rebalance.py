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
from mpi_trainer.data.partition import block_bounds, shuffled_order
from mpi_trainer.data.placement import HeldBlock, HeldRows, ScatterLedger, fixed_positions, rows_needed
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import ConfigError
from mpi_trainer.hooks import TestHooks
from mpi_trainer.worker.slowdown import make_slowdown


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


@pytest.mark.parametrize("engine", [["aggregation.ssp=2"], ["debug.async_engine=true"]])
@pytest.mark.parametrize("placement", ["shared", "scatter"])
def test_rebalancing_runs_on_the_ssp_engine_but_not_with_fixed_step_rounds(engine, placement):
    from mpi_trainer.launch.roles import pick_roles
    from mpi_trainer.scheduler import StaleSynchronousEngine

    keys = ["data.rebalance=true", f"data.placement='{placement}'", *engine]
    cfg = load_config(None, keys)
    assert pick_roles(cfg).engine is StaleSynchronousEngine and cfg.data.rebalance
    assert cfg.data.scatters == (placement == "scatter")
    with pytest.raises(ConfigError, match="`data.rebalance` cannot be combined with `train.sync_every` > 0"):
        load_config(None, [*keys, "train.sync_every=4"])


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


def test_a_worker_rereads_its_rows_when_its_block_is_recut():
    cfg = load_config(None, ["data.source=digits", "data.rebalance=true"])
    dataset = load_dataset(cfg.data, 0)
    total = dataset.num_train
    plan = SimpleNamespace(num_train=total, shuffle_seed=0, class_weight=None, block_bounds=block_bounds(total, 2))
    data = HeldBlock(dataset.train, plan, 2, cfg)
    assert len(data.fixed_x) == total // 2
    assert not data.set_blocks(plan.block_bounds)  # unchanged: nothing re-read
    recut = [(0, total // 3), (total // 3, total)]
    assert data.set_blocks(recut)
    expected = np.sort(shuffled_order(total, 0)[total // 3:])
    x, y = dataset.train.read(expected)
    np.testing.assert_array_equal(data.fixed_x, x)
    np.testing.assert_array_equal(data.fixed_y, y)
    assert data.round_total(0) == total and data.block_sizes == [total // 3, total - total // 3]


@pytest.mark.parametrize("override, message", [
    ("train.max_steps=100", "Received: train.max_steps=100 with aggregation.ssp=1"),
    ("train.nan_policy='rollback'", "Received: train.nan_policy='rollback' with aggregation.ssp=1"),
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


def test_a_recut_under_scatter_moves_only_the_rows_that_changed_owner():
    cfg, dataset, plan, recut = _scatter_setup()
    total, order = dataset.num_train, shuffled_order(dataset.num_train, 0)
    ledger = ScatterLedger(cfg, plan, [1, 2])
    np.testing.assert_array_equal(ledger.held[1], np.sort(order[:total // 2]))
    moved = ledger.recut(recut, 1)
    np.testing.assert_array_equal(moved[1], np.sort(order[total // 2:2 * total // 3]))  # rank 2's old rows
    assert len(moved[2]) == 0  # rank 2's new block lies inside its old one
    np.testing.assert_array_equal(ledger.held[2], np.sort(order[2 * total // 3:]))  # it drops the rest
    assert all(len(rows) == 0 for rows in ledger.recut(recut, 2).values())  # same blocks: nothing moves


def test_a_worker_under_scatter_trains_on_the_same_rows_after_a_recut_with_increment():
    cfg, dataset, plan, recut = _scatter_setup("data.increment.enabled=true")
    ledger = ScatterLedger(cfg, plan, [1, 2])
    before = {rank: set(ledger.held[rank]) for rank in (1, 2)}
    moved = ledger.recut(recut, 2)
    for rank in (1, 2):
        held = rows_needed(plan, rank, cfg, 0)
        scattered = HeldBlock(HeldRows(held, *dataset.train.read(held)), plan, rank, cfg)
        scattered.take_rows(HeldRows(moved[rank], *dataset.train.read(moved[rank])), recut.block_bounds, 2)
        scattered.set_blocks(recut.block_bounds)
        shared = HeldBlock(dataset.train, recut, rank, cfg)
        for round_index in (2, 3):  # the new block's draws too, which scatter did not predict at set-up
            ours, theirs = scattered.for_round(round_index), shared.for_round(round_index)
            for a, b in ((ours.x, theirs.x), (ours.y, theirs.y)):
                np.testing.assert_array_equal(a, b)
        assert not before[rank] & set(moved[rank])  # nothing a worker holds travels again
        np.testing.assert_array_equal(scattered.source.positions, ledger.held[rank])  # both sides agree
    assert 0 < len(moved[1]) < len(ledger.held[1])
    np.testing.assert_array_equal(rows_needed(recut, 1, cfg, 4), fixed_positions(recut, 1))  # no round left


def test_held_rows_merge_keeps_exactly_the_rows_asked_for():
    def rows(positions):
        positions = np.asarray(positions, dtype=np.int64)
        return HeldRows(positions, positions[:, None] * np.ones((1, 2), np.float32), positions.astype(np.int32))

    merged = rows([1, 4, 6, 9]).merged(rows([2, 7]), keep=np.array([2, 4, 7, 9]))
    np.testing.assert_array_equal(merged.positions, [2, 4, 7, 9])
    np.testing.assert_array_equal(merged.x[:, 1], [2, 4, 7, 9])
    np.testing.assert_array_equal(merged.y, [2, 4, 7, 9])
    with pytest.raises(RuntimeError, match="did not send it"):
        rows([1, 4]).merged(rows([2]), keep=np.array([2, 3]))


def test_a_recut_whose_rows_may_not_have_arrived_counts_only_the_rows_held_either_way():
    """fault.survive: a round lost after a re-cut leaves each worker with its old rows or its new ones."""
    cfg, dataset, plan, recut = _scatter_setup()
    ledger = ScatterLedger(cfg, plan, [1, 2])
    before = {rank: ledger.held[rank].copy() for rank in (1, 2)}
    ledger.recut(recut, 1)
    after = {rank: ledger.held[rank].copy() for rank in (1, 2)}
    ledger.doubt()
    for rank in (1, 2):
        np.testing.assert_array_equal(ledger.held[rank], np.intersect1d(before[rank], after[rank]))
    # the next re-cut sends rank 1 every row of its new block it may lack, whichever it holds
    moved = ledger.recut(recut, 1)
    np.testing.assert_array_equal(np.union1d(moved[1], ledger.held[1]), after[1])
    assert len(np.intersect1d(moved[1], before[1])) == 0
    ledger.confirm()
    assert ledger.unconfirmed is None
