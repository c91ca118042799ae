"""``train.sync_every = k``: k local steps per round, in one process with real workers (local transport)."""

from __future__ import annotations

import numpy as np
import pytest
from local_job import run_local_job

from mpi_trainer.models import rebuild_model

# Plain SGD (no momentum) and no dropout: averaging after each step is then exactly one
# synchronous SGD step on the two workers' batches together.
EXACT = {"model": {"name": "mlp", "optimizer": "sgd", "learning_rate": 0.1},
         "aggregation": {"method": "average"}, "data": {"validation_size": 0.0}}


def steps_per_round(job) -> list[int]:
    totals = [0] + [int(row["steps"]) for row in job.rounds()]
    return [b - a for a, b in zip(totals, totals[1:])]


def replay_synchronous_sgd(job) -> np.ndarray:
    """Single-process SGD from the same start on each step's batches of all workers, concatenated."""
    model = rebuild_model(job.engine.plan.model)
    codec = job.engine.codec
    model.set_weights(codec.unflatten(job.engine.initial_weights))
    first, second = job.workers
    for rows_a, rows_b in zip(first.step_rows_by_round, second.step_rows_by_round, strict=True):
        for a, b in zip(rows_a, rows_b, strict=True):
            x = np.concatenate([first.data.fixed_x[a], second.data.fixed_x[b]])
            y = np.concatenate([first.data.fixed_y[a], second.data.fixed_y[b]])
            model.train_on_batch(x, y)
    return codec.flatten(model.get_weights())


def test_averaging_after_every_step_is_synchronous_sgd_on_the_concatenated_batches(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 4, "batch_size": 32, "sync_every": 1}, **EXACT)
    sizes = [end - start for start, end in job.engine.plan.block_bounds]
    assert sizes[0] == sizes[1]  # equal blocks: every step's two batches have the same size
    assert all(len(steps) == 1 for w in job.workers for steps in w.step_rows_by_round)
    expected = replay_synchronous_sgd(job)
    assert not np.allclose(expected, job.engine.initial_weights, atol=1e-3)  # it did train
    np.testing.assert_allclose(job.engine.weights, expected, atol=1e-5)


def test_local_steps_between_averages_are_not_synchronous_sgd(tmp_path):
    """The replay above can tell: two local steps per average drift away from it."""
    job = run_local_job(tmp_path, workers=2, train={"epochs": 2, "batch_size": 32, "sync_every": 2}, **EXACT)
    assert np.abs(job.engine.weights - replay_synchronous_sgd(job)).max() > 1e-4


def test_a_round_runs_exactly_k_steps_per_worker_and_rounds_csv_counts_them(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 3, "batch_size": 64, "sync_every": 3})
    assert steps_per_round(job) == [6, 6, 6]
    for worker in job.workers:
        assert [report.steps for report, _ in worker.trained] == [3, 3, 3]
        assert [len(steps) for steps in worker.step_rows_by_round] == [3, 3, 3]
        assert all(len(rows) == 64 for steps in worker.step_rows_by_round for rows in steps)
    assert job.summary["steps"] == 18


def test_the_walk_carries_across_rounds_and_uses_every_row_once_before_repeating(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 7, "batch_size": 128, "sync_every": 2})
    for worker in job.workers:
        block = len(worker.data.fixed_x)
        batches = [rows for steps in worker.step_rows_by_round for rows in steps]
        per_epoch = -(-block // 128)
        assert 2 < per_epoch and len(batches) == 14 >= 2 * per_epoch  # an epoch spans rounds; the walk wraps
        first, second = (np.concatenate(batches[i * per_epoch:(i + 1) * per_epoch]) for i in (0, 1))
        assert sorted(first) == list(range(block)) == sorted(second)
        assert not np.array_equal(first, second)  # a new shuffle at the wrap


def test_max_steps_deals_the_last_round_out_of_k_step_rounds(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 5, "batch_size": 64, "sync_every": 3,
                                                    "max_steps": 10})
    assert steps_per_round(job) == [6, 4] and job.summary["stop_reason"] == "max_steps"
    assert [[r.steps for r, _ in w.trained] for w in job.workers] == [[3, 2], [3, 2]]


@pytest.mark.parametrize("sections", [{"aggregation": {"ssp": 1}}, {"aggregation": {"method": "best"}}])
def test_k_step_updates_under_ssp_and_rounds_under_election(tmp_path, sections):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 3, "batch_size": 32, "sync_every": 2}, **sections)
    assert all(report.steps == 2 for w in job.workers for report, _ in w.trained)
    assert sum(steps_per_round(job)) == job.summary["steps"] == 2 * sum(len(w.trained) for w in job.workers)
    assert 0.0 < float(job.rounds()[-1]["test_accuracy"]) <= 1.0


def test_k_step_rounds_train_augmented_batches(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 2, "batch_size": 32, "sync_every": 2},
                        data={"augmentation": {"enabled": True, "shift": 0.1}})
    assert steps_per_round(job) == [4, 4]
    for worker in job.workers:  # the walk goes on through the block, batch by batch, augmented or not
        rows = np.concatenate([rows for steps in worker.step_rows_by_round for rows in steps])
        assert [len(steps) for steps in worker.step_rows_by_round] == [2, 2] and len(set(rows)) == 4 * 32
    assert np.isfinite(job.engine.weights).all() and not np.allclose(job.engine.weights,
                                                                     job.engine.initial_weights)


def test_a_nan_rollback_in_k_step_rounds_goes_back_and_keeps_k_steps_a_round(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 4, "batch_size": 32, "sync_every": 2,
                                                    "nan_policy": "rollback"},
                        checkpoint={"every": 1}, debug={"nan_rank": 1, "nan_round": 2})
    assert [(r["round"], r["checkpoint_round"]) for r in job.summary["rollbacks"]] == [(2, 1)]
    assert [int(row["round"]) for row in job.rounds()] == [0, 1, 2, 3]
    assert all(report.steps == 2 for w in job.workers for report, _ in w.trained)
    assert job.summary["stop_reason"] == "epochs"


def scored_rounds(job) -> list[int]:
    return [int(row["round"]) for row in job.rounds() if row["test_accuracy"] not in ("", "nan")]


def test_evaluation_every_scores_every_nth_round_the_last_and_checkpointed_ones(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 6, "batch_size": 64, "sync_every": 1},
                        evaluation={"every": 4}, checkpoint={"every": 3})
    rows = job.rounds()
    assert scored_rounds(job) == [2, 3, 5]  # checkpoint after 2, every 4th round, the last
    assert all(float(rows[i]["eval_seconds"]) == 0.0 for i in (0, 1, 4))
    best = max(float(rows[i]["test_accuracy"]) for i in (2, 3, 5))
    assert job.summary["best_test_accuracy"] == pytest.approx(best, abs=1e-9)  # the CSV rounds to 10 digits
    assert job.summary["final_test_accuracy"] == pytest.approx(float(rows[5]["test_accuracy"]), abs=1e-9)


def test_by_default_k_step_rounds_are_scored_once_per_local_epoch_of_the_largest_block(tmp_path):
    # digits: blocks of 719 rows = 12 batches of 64; at k = 5 a local epoch takes 3 rounds, so
    # rounds 2 and 5 close one, and 6 is the last
    job = run_local_job(tmp_path, workers=2, train={"epochs": 7, "batch_size": 64, "sync_every": 5})
    assert job.rounds()[0]["block_sizes"] == "719;719" and job.summary["steps"] == 7 * 2 * 5
    assert scored_rounds(job) == [2, 5, 6]
    every_round = run_local_job(tmp_path / "each", workers=2, train={"epochs": 3, "batch_size": 64})
    assert scored_rounds(every_round) == [0, 1, 2]  # a round that is a local epoch is scored every time


def test_a_run_ended_by_max_steps_scores_its_last_round(tmp_path):
    job = run_local_job(tmp_path, workers=2, train={"epochs": 50, "batch_size": 64, "sync_every": 1,
                                                    "max_steps": 6}, evaluation={"every": 10})
    assert len(job.rounds()) == 3 and scored_rounds(job) == [2]
    assert job.summary["stop_reason"] == "max_steps" and job.summary["final_test_accuracy"] > 0


def test_early_stopping_counts_scored_rounds_only(tmp_path):
    # min_delta = 1 can never be beaten: the run stops at the second scored round after the first
    job = run_local_job(tmp_path, workers=2, train={"epochs": 20, "batch_size": 64, "sync_every": 1},
                        evaluation={"every": 3}, early_stopping={"patience": 2, "min_delta": 1.0})
    assert scored_rounds(job) == [2, 5, 8] and len(job.rounds()) == 9
    assert job.summary["stop_reason"] == "early_stopping" and job.summary["best_round"] == 2
