"""What a worker does before round 0: time steps for rebalancing, trace the partial batch of k-step rounds."""

from __future__ import annotations

import numpy as np
import pytest
from local_job import build_local_job

from mpi_trainer.algorithms.rebalance import MIN_TIMED_STEPS

SLOW_RANK_2 = {"batch_delay": 0.004, "slow_ranks": [2], "slow_factor": 4.0}


def test_calibration_times_enough_steps_and_leaves_the_model_as_it_was(tmp_path):
    engine, team, _ = build_local_job(tmp_path, data={"rebalance": True}, train={"batch_size": 32})
    worker = team[0]
    before = [w.copy() for w in worker.model.get_weights()]
    speed = worker.calibrate()
    assert speed.timed_steps == MIN_TIMED_STEPS and speed.samples == MIN_TIMED_STEPS * 32
    assert speed.step_rate == speed.samples / speed.seconds > 0
    for old, new in zip(before, worker.model.get_weights(), strict=True):
        np.testing.assert_array_equal(old, new)
    assert all(not np.any(v.numpy()) for v in worker.model.optimizer.variables if "learning_rate" not in v.path)


def test_the_slowed_worker_gets_the_smaller_first_block(tmp_path):
    engine, team, _ = build_local_job(tmp_path, data={"rebalance": True}, debug=SLOW_RANK_2,
                                      train={"batch_size": 32})
    equal = list(engine.plan.block_bounds)
    engine.seed_speeds({worker.rank: worker.calibrate() for worker in team}, seconds=1.5)
    fast, slow = (end - start for start, end in engine.plan.block_bounds)
    assert slow < 0.4 * (fast + slow) < fast, engine.plan.block_bounds  # 4x slower: about a fifth
    assert engine.plan.block_bounds[-1][1] == equal[-1][1] and engine.plan.block_bounds[0][0] == 0
    assert engine.recorder.elapsed() >= 1.5  # the run's clock counts the calibration


def test_without_rebalancing_nothing_is_timed(tmp_path):
    _, team, _ = build_local_job(tmp_path, train={"batch_size": 32})
    assert team[0].calibrate() is None


@pytest.mark.parametrize("train, traced", [({"sync_every": 1}, True), ({"sync_warmup_epochs": 1}, True),
                                           ({}, False)])
def test_k_step_rounds_trace_the_partial_batch_before_round_0(tmp_path, monkeypatch, train, traced):
    import keras

    sizes: list[int] = []
    stepping = keras.Model.train_on_batch

    def recorded(self, x, y=None, *args, **kwargs):
        sizes.append(len(x))
        return stepping(self, x, y, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "train_on_batch", recorded)
    _, team, _ = build_local_job(tmp_path, train={"batch_size": 64, **train})
    partial = len(team[0].data.fixed_x) % 64
    assert partial  # digits' blocks are not a multiple of 64
    # a pass over the block ends with that batch: its shape is traced in the dry run, not mid-round
    assert (partial in sizes) is traced, sizes
