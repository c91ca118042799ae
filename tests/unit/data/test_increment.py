"""Random data increment: the draws and their sizes, plain numbers, no MPI."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.config import ConfigError, IncrementConfig, load_config
from mpi_trainer.data.increment import draw_extra, extra_count, step_size


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


@pytest.mark.parametrize("key, value, expected", [
    ("load_factor", 0.0, "must lie in (0, 1]"),
    ("absolute_factor", 1.5, "must lie in (0, 1]"),
    ("min_gap", -1, "must be >= 0"),
])
def test_bad_increment_settings_name_the_key(key, value, expected):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"data.increment.{key}={value}"])
    assert str(info.value) == f"`data.increment.{key}` {expected}. Received: data.increment.{key}={value!r}"


