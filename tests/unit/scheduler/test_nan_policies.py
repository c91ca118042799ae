"""``train.nan_policy`` with real workers in one process: NaN weights from one worker stop the run on the
best weights, or roll it back to the last checkpoint at half the learning rate; the rolled-back run then
resumes on fewer workers (an elastic resume). A sum that turns non-finite after part of it was stepped into
the global weights ends the run on the weights a rollback would go back to."""

from __future__ import annotations

import math

import numpy as np
from local_job import run_local_job

from mpi_trainer.worker.training import LocalTraining

NAN = {"nan_rank": 1, "nan_round": 2}
QUICK = {"model": {"optimizer": "adam", "learning_rate": 0.003}, "checkpoint": {"every": 1}}


def round_steps(job) -> list[int]:
    """The steps each recorded round took (the rows count them cumulatively)."""
    totals = [int(row["steps"]) for row in job.rounds()]
    return [b - a for a, b in zip([0, *totals], totals)]


def test_the_stop_policy_keeps_the_best_weights(tmp_path, job_log):
    stopped = run_local_job(tmp_path, train={"epochs": 6}, debug=NAN, **QUICK)
    summary = stopped.summary
    assert summary["stop_reason"] == "nan" and summary["rounds_completed"] == 2
    assert summary["final_test_accuracy"] == summary["best_test_accuracy"]
    assert any("non-finite weights from worker rank(s) [1]; stopping" in m for m in job_log.messages)


def test_a_rollback_halves_the_learning_rate_and_the_run_resumes_on_fewer_workers(tmp_path, job_log):
    per_round = round_steps(run_local_job(tmp_path / "probe", train={"epochs": 1}, **QUICK))[0]
    budget = 4 * per_round + per_round // 2  # ends inside round 4
    rollback = {"nan_policy": "rollback", "max_steps": budget}
    rolled = run_local_job(tmp_path / "run", train={"epochs": 8, **rollback}, debug=NAN, **QUICK)
    summary = rolled.summary
    assert summary["stop_reason"] == "max_steps" and summary["steps"] == budget
    assert [int(r["round"]) for r in rolled.rounds()] == [0, 1, 2, 3, 4]
    assert summary["learning_rate"] == 0.0015 and summary["rollbacks"][0]["checkpoint_round"] == 1
    assert any("rolled back to the checkpoint of round 1, learning rate 0.003 -> 0.0015" in m
               for m in job_log.messages)

    resumed = run_local_job(tmp_path / "run", workers=1, resume=True,
                            train={"epochs": 7, "nan_policy": "rollback"}, debug=NAN, **QUICK)
    after = resumed.summary
    assert [int(r["round"]) for r in resumed.rounds()] == list(range(7))
    assert after["workers"] == 1 and after["rounds_completed"] == 7 and after["resumed_after_round"] == 4
    # the one worker takes every training row each round: the two workers' blocks together
    train_rows = resumed.engine.dataset.num_train
    assert round_steps(resumed)[5:] == [math.ceil(train_rows / 64)] * 2
    assert after["traffic_bytes"] > summary["traffic_bytes"]
    assert after["wall_seconds"] > summary["wall_seconds"]
    assert len(after["rollbacks"]) == 1 and after["learning_rate"] == 0.0015


def test_a_sum_found_non_finite_after_part_of_the_step_ends_on_the_weights_a_rollback_takes(tmp_path, job_log,
                                                                                             monkeypatch):
    # Rank 0 steps the global weights in place part by part as the sum arrives; a worker's weights beyond
    # float16's range are finite in its report but inf on the wire, in the sum's last part only
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.SEGMENT", 256)

    def overflow(self, round_index, local):
        if round_index == 0 and self.rank == 1:
            local[-3:] = 1e6

    monkeypatch.setattr(LocalTraining, "maybe_inject_nan", overflow)
    job = run_local_job(tmp_path, train={"epochs": 3}, aggregation={"wire_dtype": "float16"}, **QUICK)
    assert job.summary["stop_reason"] == "nan" and job.summary["rounds_completed"] == 0
    # the round's start was partly overwritten: the run ends on the initial weights (no checkpoint yet), not on
    # a mix of the two
    np.testing.assert_array_equal(job.engine.weights, job.engine.initial_weights)
    assert any("non-finite aggregated weights; stopping" in m for m in job_log.messages)
    assert any("had already replaced part of the weights it started from: the run ends on the initial weights" in m
               for m in job_log.messages)
