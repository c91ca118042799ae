"""Random data increment and the worker's round arrays: plain numbers, no MPI."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mpi_trainer.config import ConfigError, IncrementConfig, load_config
from mpi_trainer.data.increment import draw_extra, extra_count, positions_needed, step_size
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.placement import HeldBlock, HeldRows, fixed_positions, rows_needed


def _cfg(**kwargs) -> IncrementConfig:
    return IncrementConfig(**{"enabled": True, **kwargs})


def test_five_workers_reach_the_absolute_factor_in_load_factor_steps():
    # 1000 samples, 5 workers: 20 % fixed each; 0.45 means 25 % random, reached in 5 % steps.
    cfg = _cfg(load_factor=0.05, absolute_factor=0.45)
    assert step_size(1000, cfg) == 50
    assert [extra_count(1000, 200, r, cfg) for r in range(7)] == [50, 100, 150, 200, 250, 250, 250]
    assert extra_count(1000, 200, 3, IncrementConfig(enabled=False)) == 0
    assert extra_count(1000, 500, 0, cfg) == 0  # the fixed block already exceeds the target


def test_min_gap_overrides_the_step_in_samples():
    cfg = _cfg(load_factor=0.05, absolute_factor=0.8, min_gap=120)
    assert step_size(1000, cfg) == 120
    assert [extra_count(1000, 250, r, cfg) for r in range(6)] == [120, 240, 360, 480, 550, 550]


def test_draws_are_disjoint_from_the_fixed_block_and_reproducible():
    cfg = _cfg(load_factor=0.1, absolute_factor=0.6)
    fixed = np.arange(0, 1000, 4)  # 250 samples
    draws = [draw_extra(1000, fixed, r, rank=2, seed=7, cfg=cfg) for r in range(4)]
    for round_index, draw in enumerate(draws):
        assert len(draw) == extra_count(1000, 250, round_index, cfg) == len(set(draw))
        assert not np.intersect1d(draw, fixed).size
        np.testing.assert_array_equal(draw, draw_extra(1000, fixed, round_index, 2, 7, cfg))
    assert not np.array_equal(draws[1][:50], draws[2][:50])  # a fresh draw each round
    assert not np.array_equal(draw_extra(1000, fixed, 1, 3, 7, cfg), draws[1])  # and per rank


def test_positions_needed_is_the_union_of_the_block_and_every_draw():
    cfg = _cfg(load_factor=0.05, absolute_factor=0.5)
    fixed = np.arange(100)
    needed = positions_needed(400, fixed, 3, 1, 0, cfg)
    expected = np.unique(np.concatenate([fixed] + [draw_extra(400, fixed, r, 1, 0, cfg) for r in range(3)]))
    np.testing.assert_array_equal(needed, expected)
    np.testing.assert_array_equal(positions_needed(400, fixed, 3, 1, 0, IncrementConfig()), fixed)


@pytest.mark.parametrize("key, value, expected", [
    ("load_factor", 0.0, "must lie in (0, 1]"),
    ("absolute_factor", 1.5, "must lie in (0, 1]"),
    ("min_gap", -1, "must be >= 0"),
])
def test_bad_increment_settings_name_the_key(key, value, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"data.increment.{key}={value}"])
    assert str(info.value) == f"`data.increment.{key}` {expected}. Received: data.increment.{key}={value!r}"


def _plan(total: int, workers: int) -> SimpleNamespace:
    return SimpleNamespace(num_train=total, shuffle_seed=3, class_weight=None,
                           block_bounds=block_bounds(total, workers))


def test_worker_data_serves_block_plus_draw_and_weighted_totals():
    total, workers = 200, 4
    x = np.arange(total, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    held = HeldRows(np.arange(total), x, np.arange(total) % 3)
    cfg = load_config(None, ["data.increment.enabled=true", "data.increment.load_factor=0.1",
                             "data.increment.absolute_factor=0.5"])
    data = HeldBlock(held, _plan(total, workers), 2, cfg)
    block = fixed_positions(_plan(total, workers), 2)
    np.testing.assert_array_equal(data.fixed_x[:, 0], block)
    feed = data.for_round(1)
    xs, ys = feed.x, feed.y
    assert len(xs) == 50 + 40 and len(ys) == len(xs)
    assert not np.intersect1d(xs[50:, 0], block).size
    assert data.round_total(1) == workers * (50 + 40)
    assert data.round_total(5) == workers * 100  # each share capped at half the data


def test_held_rows_refuse_positions_that_were_not_sent():
    held = HeldRows(np.array([1, 4, 9]), np.zeros((3, 2)), np.zeros(3))
    np.testing.assert_array_equal(held.read(np.array([4, 9]))[0], np.zeros((2, 2)))
    with pytest.raises(RuntimeError, match="did not send"):
        held.read(np.array([5]))


def test_scatter_under_ssp_sends_the_draws_of_a_worker_running_s_updates_ahead():
    total, workers = 200, 2
    x = np.arange(total, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    rows = HeldRows(np.arange(total), x, np.arange(total) % 3)
    cfg = load_config(None, ["data.increment.enabled=true", "data.increment.load_factor=0.05",
                             "train.epochs=4", "aggregation.ssp=2"])
    plan = SimpleNamespace(**vars(_plan(total, workers)), start_round=0)
    sent = rows_needed(plan, 1, cfg, 0)
    held = HeldRows(sent, *rows.read(sent))
    data = HeldBlock(held, plan, 1, cfg)
    last_clock = cfg.train.epochs - 1 + cfg.aggregation.ssp  # the slowest worker at epochs - 1, this one s ahead
    xs = data.for_round(last_clock).x
    assert len(xs) == total // workers + extra_count(total, total // workers, last_clock, cfg.data.increment)
    no_ssp = load_config(None, ["data.increment.enabled=true", "data.increment.load_factor=0.05", "train.epochs=4"])
    assert len(rows_needed(plan, 1, no_ssp, 0)) < len(sent)  # synchronous rounds need no more than epochs
