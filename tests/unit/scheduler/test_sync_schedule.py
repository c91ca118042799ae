"""Post-local SGD (``train.sync_warmup_epochs``): warm-up rounds of a few steps, then ``train.sync_every``,
in one process with real workers (local transport)."""

from __future__ import annotations

import logging

import numpy as np
from local_job import run_local_job
from test_sync_every import EXACT, replay_synchronous_sgd, scored_rounds, steps_per_round

from mpi_trainer.logs import get_logger

# digits: 1,437 training rows, blocks of 719 and 718; at batch 256 a local epoch is 3 steps,
# so a warm-up epoch at one step per round is 3 rounds.
WARMUP = {"batch_size": 256, "sync_warmup_epochs": 1}


def test_warm_up_rounds_run_one_step_over_an_epoch_of_the_block_then_k_steps(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={**WARMUP, "epochs": 5, "sync_every": 2})
    assert steps_per_round(job) == [2, 2, 2, 4, 4]
    assert [int(row["sync_every"]) for row in job.rounds()] == [1, 1, 1, 2, 2]
    for worker in job.workers:
        assert [len(steps) for steps in worker.step_rows_by_round] == [1, 1, 1, 2, 2]
        warm_up = np.concatenate([steps[0] for steps in worker.step_rows_by_round[:3]])
        assert sorted(warm_up) == list(range(len(worker.data.fixed_x)))  # the warm-up walked one epoch


def test_after_the_warm_up_a_round_is_one_local_epoch(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={**WARMUP, "epochs": 5})
    assert steps_per_round(job) == [2, 2, 2, 6, 6]
    assert [int(row["sync_every"]) for row in job.rounds()] == [1, 1, 1, 0, 0]
    for worker in job.workers:
        assert [r.steps for r, _ in worker.trained] == [1, 1, 1, 3, 3]
        assert [len(steps) for steps in worker.step_rows_by_round] == [1, 1, 1, 0, 0]  # fit, not the walk


def test_warm_up_rounds_are_synchronous_sgd_on_the_concatenated_batches(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 4, "batch_size": 32, "sync_warmup_epochs": 1,
                                                    "sync_every": 5}, **EXACT)
    assert job.engine.schedule.warmup_rounds > 4  # every round of this run is a warm-up round
    assert [int(row["sync_every"]) for row in job.rounds()] == [1, 1, 1, 1]
    expected = replay_synchronous_sgd(job)
    assert not np.allclose(expected, job.engine.initial_weights, atol=1e-3)
    np.testing.assert_allclose(job.engine.weights, expected, atol=1e-5)


def test_max_steps_deals_out_the_first_round_after_the_warm_up(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={**WARMUP, "epochs": 9, "sync_every": 2, "max_steps": 9})
    assert steps_per_round(job) == [2, 2, 2, 3] and job.summary["stop_reason"] == "max_steps"
    assert [[r.steps for r, _ in w.trained] for w in job.workers] == [[1, 1, 1, 2], [1, 1, 1, 1]]


def test_evaluation_every_counts_local_epochs_in_the_warm_up_and_rounds_after(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={**WARMUP, "sync_warmup_epochs": 2, "epochs": 10},
                        evaluation={"every": 2})
    # warm-up: rounds 0-5, epochs end at rounds 2 and 5 (the 2nd is scored); then rounds 6-9: 7, 9
    assert scored_rounds(job) == [5, 7, 9]


def test_a_run_that_ends_inside_the_warm_up_is_warned_about_and_the_log_names_the_phases(tmp_path, caplog):
    logger = get_logger()
    logger.addHandler(caplog.handler)  # the job's own logger may not propagate to the root
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    try:
        run_local_job(tmp_path, workers=2, train={**WARMUP, "sync_warmup_epochs": 2, "epochs": 2})
    finally:
        logger.removeHandler(caplog.handler)
    text = caplog.text
    assert "train.epochs=2 rounds end inside the sync warm-up of 6 rounds" in text
    assert "sync schedule: rounds 0-5 are the warm-up, 1 local step(s) each (3 rounds per local epoch)" in text


def test_a_local_epoch_closes_every_third_warm_up_round_then_every_second_round_at_k_2():
    from mpi_trainer.algorithms.sync_schedule import SyncSchedule

    # blocks of 719 rows at batch 256: 3 steps an epoch; warm-up at 1 step a round, then 2 steps
    schedule = SyncSchedule.plan(2, 1, 1, [719, 718], 256)
    assert (schedule.warmup_rounds, schedule.rounds_per_warmup_epoch, schedule.rounds_per_epoch) == (3, 3, 2)
    assert [r for r in range(9) if schedule.closes_epoch(r)] == [2, 4, 6, 8]
    assert all(SyncSchedule.plan(0, 0, 1, [719], 256).closes_epoch(r) for r in range(3))


def test_the_warm_up_trains_under_election_with_overlapped_scoring_and_checkpoints(tmp_path):
    from mpi_trainer.persistence.checkpoint import load_checkpoint

    job = run_local_job(tmp_path, workers=2, train={**WARMUP, "epochs": 4, "overlap_eval": True},
                        aggregation={"method": "best"}, checkpoint={"every": 1})
    rows = job.rounds()
    assert [int(row["sync_every"]) for row in rows] == [1, 1, 1, 0]  # three one-step rounds, then a local epoch
    assert all(row["winner"] in ("1", "2") for row in rows)  # every round elected a worker's weights
    assert [[r.steps for r, _ in w.trained] for w in job.workers] == [[1, 1, 1, 3], [1, 1, 1, 3]]
    assert load_checkpoint(tmp_path / "checkpoint.h5")[1]["round"] == 3


def test_a_run_resumed_inside_the_warm_up_finishes_the_warm_up_then_takes_k_step_rounds(tmp_path):
    # two warm-up epochs are 6 one-step rounds; the first run ends after 4 of them, checkpointing every round
    schedule = {**WARMUP, "sync_warmup_epochs": 2, "sync_every": 2}
    run_local_job(tmp_path, workers=2, train={**schedule, "epochs": 4}, checkpoint={"every": 1})
    resumed = run_local_job(tmp_path, workers=2, resume=True, train={**schedule, "epochs": 8},
                            checkpoint={"every": 1})
    rows = resumed.rounds()
    assert [int(row["round"]) for row in rows] == list(range(8))
    assert [int(row["sync_every"]) for row in rows] == [1] * 6 + [2, 2]  # the phase follows the round index
    assert [[r.steps for r, _ in w.trained] for w in resumed.workers] == [[1, 1, 2, 2]] * 2
    assert resumed.summary["resumed_after_round"] == 3 and resumed.summary["steps"] == 2 * (6 * 1 + 2 * 2)
