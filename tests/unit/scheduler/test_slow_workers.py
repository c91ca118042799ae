"""Whole jobs in one process (local transport, real workers) on the quick start's settings: early stopping,
a slowed worker under SSP (staleness bound, best-of windows, damping), block rebalancing and overlapped
evaluation."""

from __future__ import annotations

import re

import pytest
from local_job import LocalJob, run_local_job

from mpi_trainer.data.partition import block_bounds
from mpi_trainer.persistence.run_files import read_rounds

# configs/quickstart.toml's data split, model and batches
QUICK = {"data": {"test_size": 0.2, "validation_size": 0.1}, "model": {"name": "mlp", "learning_rate": 0.003}}
# digits/mlp batches last about a millisecond: 10 ms of simulated work per batch on every worker,
# three times as long on rank 2, makes a clear straggler whatever else loads the machine
SLOW_RANK_2 = {"batch_delay": 0.01, "slow_ranks": [2], "slow_factor": 3.0}


def quick_job(run_dir, epochs: int, train: dict | None = None, data: dict | None = None, **sections) -> LocalJob:
    return run_local_job(run_dir, train={"epochs": epochs, "batch_size": 32, **(train or {})},
                         data={**QUICK["data"], **(data or {})}, model=QUICK["model"], **sections)


def logged(log: pytest.LogCaptureFixture, start: str) -> list[str]:
    """The job's messages that begin with ``start``, each once however many handlers saw it."""
    records = {id(record): record for record in log.records if record.getMessage().startswith(start)}
    return [record.getMessage() for record in records.values()]


def read_updates(run_dir) -> list[dict[str, str]]:
    return read_rounds(run_dir / "updates.csv")


def test_early_stopping_restores_the_best_round_and_frees_the_workers(tmp_path):
    job = quick_job(tmp_path, 10, early_stopping={"patience": 2, "min_delta": 0.5})
    summary = job.summary
    assert summary["stop_reason"] == "early_stopping"
    assert summary["rounds_completed"] == 3  # round 0 sets the best; two more without a 0.5 gain
    assert summary["final_round"] == 0
    assert summary["final_test_accuracy"] == pytest.approx(float(job.rounds()[0]["test_accuracy"]))
    assert [len(worker.trained) for worker in job.workers] == [3, 3]  # released after round 2: nobody waits


def test_ssp_bounds_staleness_and_uses_it_with_a_slow_worker(tmp_path, job_log):
    # min_delta = 1 can never be met: early stopping ends the run after round 3 of 6, while
    # workers still hold updates, which the scheduler must take in before releasing them
    job = quick_job(tmp_path, 6, aggregation={"ssp": 1}, checkpoint={"every": 2},
                    early_stopping={"patience": 3, "min_delta": 1.0}, debug=SLOW_RANK_2)
    rounds, updates = job.rounds(), read_updates(tmp_path)
    assert [int(r["round"]) for r in rounds] == [0, 1, 2, 3]
    assert len(updates) == 4 * 2
    assert all(0 <= int(r["max_staleness"]) <= 1 for r in rounds)
    assert max(int(u["staleness"]) for u in updates) == 1, updates  # the fast worker really ran ahead
    ahead = {w: sum(1 for u in updates if u["worker"] == w and u["staleness"] == "1") for w in ("1", "2")}
    assert ahead["1"] > ahead["2"], updates  # and it is the fast one that runs ahead
    for round_row in rounds:  # each round's max_staleness is that of its own updates
        own = [int(u["staleness"]) for u in updates if u["round"] == round_row["round"]]
        assert len(own) == 2 and int(round_row["max_staleness"]) == max(own)
    assert [int(u["version"]) for u in updates] == list(range(1, 9))
    assert all(int(u["base_version"]) < int(u["version"]) for u in updates)
    summary = job.summary
    assert summary["ssp"] == 1 and summary["rounds_completed"] == 4
    assert summary["stop_reason"] == "early_stopping" and summary["final_round"] == 0
    assert summary["final_test_accuracy"] == pytest.approx(float(rounds[0]["test_accuracy"]), abs=1e-5)
    assert float(rounds[-1]["test_accuracy"]) > 0.8
    assert (tmp_path / "checkpoint.h5").is_file() and (tmp_path / "final.weights.h5").is_file()
    assert any(", staleness 1," in line for line in logged(job_log, "update "))


def test_ssp_best_elects_each_windows_top_scoring_update_and_keeps_its_weights(tmp_path, job_log):
    # monitor = val_accuracy makes the scheduler score the weights it kept on the validation split the
    # workers scored on, so each round's val_* are measured on the elected model, not copied from a report
    job = quick_job(tmp_path, 4, aggregation={"ssp": 1, "method": "best"},
                    early_stopping={"monitor": "val_accuracy"}, debug=SLOW_RANK_2)
    rounds, updates = job.rounds(), read_updates(tmp_path)
    assert [int(r["round"]) for r in rounds] == [0, 1, 2, 3] and len(updates) == 4 * 2
    assert all(u["share"] == "nan" for u in updates)  # best merges no delta: the winner replaces the model
    assert all(0.0 <= float(u["val_accuracy"]) <= 1.0 for u in updates)  # every update was scored
    assert max(int(u["staleness"]) for u in updates) == 1, updates
    for round_row in rounds:
        window = [u for u in updates if u["round"] == round_row["round"]]
        # the one election rule: highest validation accuracy, then lowest loss, then lowest rank, then earliest
        top = min(window, key=lambda u: (-float(u["val_accuracy"]), float(u["val_loss"]), int(u["worker"]),
                                         int(u["update"])))
        assert len(window) == 2 and round_row["winner"] == top["worker"] in ("1", "2"), (round_row, window)
        assert float(round_row["val_accuracy"]) == pytest.approx(float(top["val_accuracy"]), abs=1e-6)
        assert float(round_row["val_loss"]) == pytest.approx(float(top["val_loss"]), rel=1e-4)
    assert len(logged(job_log, "window election: ")) == 4
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def test_ssp_staleness_damping_divides_each_updates_share_by_one_plus_its_staleness(tmp_path, job_log):
    job = quick_job(tmp_path, 4, aggregation={"ssp": 2, "method": "weighted", "staleness_damping": True},
                    debug=SLOW_RANK_2)
    rounds, updates = job.rounds(), read_updates(tmp_path)
    assert len(rounds) == 4 and len(updates) == 4 * 2
    staleness = [int(u["staleness"]) for u in updates]
    assert 0 in staleness and 0 < max(staleness) <= 2, updates
    total = sum(int(size) for size in rounds[0]["block_sizes"].split(";"))  # the training set: N
    for update, stale in zip(updates, staleness):  # weighted: n_w / N, damped by 1 + staleness
        assert float(update["share"]) == pytest.approx(int(update["samples"]) / total / (1 + stale), rel=1e-6)
    assert "with staleness damping" in job_log.text
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def block_sizes(job: LocalJob) -> list[list[int]]:
    return [[int(s) for s in r["block_sizes"].split(";")] for r in job.rounds()]


def test_rebalancing_shrinks_the_slow_workers_block_and_keeps_full_coverage(tmp_path, job_log):
    job = quick_job(tmp_path, 4, data={"rebalance": True}, aggregation={"method": "weighted"}, debug=SLOW_RANK_2)
    rounds, sizes = job.rounds(), block_sizes(job)
    total = sum(sizes[0])
    assert all(sum(s) == total == int(r["samples"]) for s, r in zip(sizes, rounds))
    # round 0 is cut already, from the steps each worker timed before it: the slow worker gets less to do
    assert sizes[0][1] < 0.45 * total < sizes[0][0], sizes
    assert sizes[-1][1] < 0.45 * total < sizes[-1][0], sizes
    assert "before round 0 blocks cut by calibrated speed" in job_log.text
    assert all(0.0 <= float(r["idle_fraction"]) < 1.0 for r in rounds)
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def test_rebalancing_under_scatter_bills_the_rows_that_changed_owner_to_their_round(tmp_path, job_log):
    job = quick_job(tmp_path, 4, data={"rebalance": True, "placement": "scatter"},
                    aggregation={"method": "weighted"}, debug=SLOW_RANK_2)
    rounds, sizes = job.rounds(), block_sizes(job)
    total = sizes[0][0] + sizes[0][1]
    assert all(sum(s) == total == int(r["samples"]) for s, r in zip(sizes, rounds))
    assert sizes[-1][1] < 0.45 * total < sizes[-1][0], sizes
    moved = [0] * len(rounds)
    pattern = r"round (\d+): sent worker rank (\d+) (\d+) training rows that changed owner"
    for r, _, rows in set(re.findall(pattern, job_log.text)):  # once, however many handlers
        moved[int(r)] += int(rows)
    # rank 1's block starts at 0 and rank 2's ends at the last sample: only the shifted boundary's rows travel,
    # from the equal split placed at set-up to round 0's calibrated cut, then from round to round
    equal = [end - start for start, end in block_bounds(total, 2)]
    assert moved == [abs(new[0] - old[0]) for old, new in zip([equal, *sizes], sizes)]
    assert moved[0] > 0
    unchanged = [int(rounds[r]["bytes"]) for r in range(1, len(rounds)) if not moved[r]]
    row_bytes = 8 + 8 * 8 * 4 + 4  # digits: int64 position, 8x8 float32 features, int32 label
    for r in (r for r in range(1, len(rounds)) if moved[r] and unchanged):
        assert int(rounds[r]["bytes"]) - min(unchanged) >= moved[r] * row_bytes
    assert float(rounds[-1]["train_accuracy"]) > 0.8 and float(rounds[-1]["test_accuracy"]) > 0.8


def test_overlapped_evaluation_trains_the_same_and_drains_the_round_under_way_on_early_stop(tmp_path, job_log):
    plain = quick_job(tmp_path / "plain", 3)
    overlap = quick_job(tmp_path / "overlap", 8, train={"overlap_eval": True},
                        early_stopping={"patience": 2, "min_delta": 0.5})
    summary = overlap.summary
    # Round 0 sets the best; rounds 1 and 2 bring no 0.5 gain; round 3 was already running and is dropped.
    assert summary["stop_reason"] == "early_stopping" and summary["rounds_completed"] == 3
    assert summary["final_round"] == 0
    assert "round 3 was already under way when early stopping decided" in job_log.text
    for ours, theirs in zip(overlap.rounds(), plain.rounds(), strict=True):
        assert float(ours["test_accuracy"]) == pytest.approx(float(theirs["test_accuracy"]), rel=1e-6)
        assert ours["bytes"] == theirs["bytes"]  # the next round's dispatch is not billed to this one
    assert summary["traffic_bytes"] > plain.summary["traffic_bytes"]  # the dropped round still cost traffic
