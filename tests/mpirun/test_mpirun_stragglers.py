"""Real ``mpirun`` jobs with a slowed worker: SSP at s = 0, 1 and 2 (best-of, damping), and block rebalancing."""

from __future__ import annotations

import csv
import re

import h5py
import numpy as np
import pytest
from conftest import run_mpi

from mpi_trainer.data.partition import block_bounds

QUICK = ["train", "configs/quickstart.toml", "--set", "train.epochs=3"]
# digits/mlp batches last about a millisecond: 10 ms of simulated work per batch on every worker,
# three times as long on rank 2, makes a clear straggler whatever else loads the machine
SLOW_RANK_2 = ["--set", "debug.batch_delay=0.01", "--set", "debug.slow_ranks=[2]",
               "--set", "debug.slow_factor=3.0"]


def final_weights(run_dir) -> list[np.ndarray]:
    arrays: list[np.ndarray] = []
    with h5py.File(run_dir / "final.weights.h5", "r") as handle:
        handle.visititems(lambda _, obj: arrays.append(obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return arrays


def read_csv(path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_ssp_engine_at_s0_gives_the_synchronous_weights(tmp_path):
    # plain averaging in both: the SSP engine merges updates as they come, so it takes no outer step
    sync = run_mpi(3, [*QUICK, "--set", "aggregation.outer_optimizer=none"], tmp_path / "sync")
    engine = run_mpi(3, [*QUICK, "--set", "debug.async_engine=true"], tmp_path / "engine")
    assert sync.returncode == 0, sync.output
    assert engine.returncode == 0, engine.output
    assert (tmp_path / "engine" / "updates.csv").is_file()  # the SSP engine really ran
    assert not (tmp_path / "sync" / "updates.csv").exists()
    for a, b in zip(final_weights(tmp_path / "sync"), final_weights(tmp_path / "engine"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    sync_acc = [float(r["test_accuracy"]) for r in sync.rounds()]
    engine_acc = [float(r["test_accuracy"]) for r in engine.rounds()]
    np.testing.assert_allclose(sync_acc, engine_acc, atol=1e-6)
    assert all(r["max_staleness"] == "0" for r in engine.rounds())


def test_ssp_bounds_staleness_and_uses_it_with_a_slow_worker(tmp_path):
    run_dir = tmp_path / "ssp1"
    # min_delta = 1 can never be met: early stopping ends the run after round 3 of 6, while
    # workers still hold updates, which the scheduler must take in before releasing them
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=6",
                         "--set", "aggregation.ssp=1", "--set", "checkpoint.every=2",
                         "--set", "early_stopping.patience=3", "--set", "early_stopping.min_delta=1.0",
                         *SLOW_RANK_2], run_dir)
    assert result.returncode == 0, result.output
    rounds, updates = result.rounds(), read_csv(run_dir / "updates.csv")
    assert [int(r["round"]) for r in rounds] == [0, 1, 2, 3]
    assert len(updates) == 4 * 2
    assert all(0 <= int(r["max_staleness"]) <= 1 for r in rounds)
    staleness = [int(u["staleness"]) for u in updates]
    assert max(staleness) == 1, updates  # the fast worker really ran ahead
    ahead = {w: sum(1 for u in updates if u["worker"] == w and u["staleness"] == "1") for w in ("1", "2")}
    assert ahead["1"] > ahead["2"], updates  # and it is the fast one that runs ahead
    for round_row in rounds:  # each round's max_staleness is that of its own updates
        own = [int(u["staleness"]) for u in updates if u["round"] == round_row["round"]]
        assert len(own) == 2 and int(round_row["max_staleness"]) == max(own)
    versions = [int(u["version"]) for u in updates]
    assert versions == list(range(1, 9))
    assert all(int(u["base_version"]) < int(u["version"]) for u in updates)
    summary = result.summary()
    assert summary["ssp"] == 1 and summary["rounds_completed"] == 4
    assert summary["stop_reason"] == "early_stopping" and summary["final_round"] == 0
    assert summary["final_test_accuracy"] == pytest.approx(float(rounds[0]["test_accuracy"]), abs=1e-5)
    assert float(rounds[-1]["test_accuracy"]) > 0.8
    assert (run_dir / "checkpoint.h5").is_file() and (run_dir / "final.weights.h5").is_file()
    assert "staleness 1" in (run_dir / "train.log").read_text()


def run_ssp_with_slow_rank_2(run_dir, *overrides: str) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Four SSP rounds on digits with worker rank 2 slowed; its rounds.csv and updates.csv rows."""
    sets = [item for override in ("train.epochs=4", *overrides) for item in ("--set", override)]
    result = run_mpi(3, ["train", "configs/quickstart.toml", *sets, *SLOW_RANK_2], run_dir)
    assert result.returncode == 0, result.output
    return result.rounds(), read_csv(run_dir / "updates.csv")


def test_ssp_best_elects_each_windows_top_scoring_update_and_keeps_its_weights(tmp_path):
    run_dir = tmp_path / "best"
    # monitor = val_accuracy makes the scheduler score the weights it kept on the validation split the
    # workers scored on, so each round's val_* are measured on the elected model, not copied from a report
    rounds, updates = run_ssp_with_slow_rank_2(run_dir, "aggregation.ssp=1", "aggregation.method=best",
                                               "early_stopping.monitor=val_accuracy")
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
    assert (run_dir / "train.log").read_text().count("window election") == 4
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def test_ssp_staleness_damping_divides_each_updates_share_by_one_plus_its_staleness(tmp_path):
    run_dir = tmp_path / "damped"
    rounds, updates = run_ssp_with_slow_rank_2(run_dir, "aggregation.ssp=2", "aggregation.method=weighted",
                                               "aggregation.staleness_damping=true")
    assert len(rounds) == 4 and len(updates) == 4 * 2
    staleness = [int(u["staleness"]) for u in updates]
    assert 0 in staleness and 0 < max(staleness) <= 2, updates
    total = sum(int(size) for size in rounds[0]["block_sizes"].split(";"))  # the training set: N
    for update, stale in zip(updates, staleness):  # weighted: n_w / N, damped by 1 + staleness
        assert float(update["share"]) == pytest.approx(int(update["samples"]) / total / (1 + stale), rel=1e-6)
    assert "with staleness damping" in (run_dir / "train.log").read_text()
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def test_rebalancing_shrinks_the_slow_workers_block_and_keeps_full_coverage(tmp_path):
    run_dir = tmp_path / "rebalance"
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=4",
                         "--set", "data.rebalance=true", "--set", "aggregation.method=weighted",
                         *SLOW_RANK_2], run_dir)
    assert result.returncode == 0, result.output
    rounds = result.rounds()
    sizes = [[int(s) for s in r["block_sizes"].split(";")] for r in rounds]
    total = sum(sizes[0])
    assert all(sum(s) == total == int(r["samples"]) for s, r in zip(sizes, rounds))
    # round 0 is cut already, from the steps each worker timed before it: the slow worker gets less to do
    assert sizes[0][1] < 0.45 * total < sizes[0][0], sizes
    assert sizes[-1][1] < 0.45 * total < sizes[-1][0], sizes
    assert "before round 0 blocks cut by calibrated speed" in (run_dir / "train.log").read_text()
    assert all(0.0 <= float(r["idle_fraction"]) < 1.0 for r in rounds)
    assert float(rounds[-1]["test_accuracy"]) > 0.8


def test_rebalancing_under_scatter_sends_the_rows_that_changed_owner_and_counts_them(tmp_path):
    run_dir = tmp_path / "scatter"
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=4",
                         "--set", "data.rebalance=true", "--set", "data.placement=scatter",
                         "--set", "aggregation.method=weighted", *SLOW_RANK_2], run_dir)
    assert result.returncode == 0, result.output
    rounds = result.rounds()
    sizes = [[int(s) for s in r["block_sizes"].split(";")] for r in rounds]
    total = sizes[0][0] + sizes[0][1]
    assert all(sum(s) == total == int(r["samples"]) for s, r in zip(sizes, rounds))
    assert sizes[-1][1] < 0.45 * total < sizes[-1][0], sizes
    moved = [0] * len(rounds)
    log = (run_dir / "train.log").read_text()
    for r, rows in re.findall(r"round (\d+): sent worker rank \d+ (\d+) training rows that changed owner", log):
        moved[int(r)] += int(rows)
    # rank 1's block starts at 0 and rank 2's ends at the last sample: only the shifted boundary's rows travel,
    # from the equal split placed at set-up to round 0's calibrated cut, then from round to round
    equal = [end - start for start, end in block_bounds(total, 2)]
    assert moved == [abs(new[0] - old[0]) for old, new in zip([equal, *sizes], sizes)]
    assert moved[0] > 0
    recut = [r for r in range(len(rounds)) if moved[r]]
    assert recut, sizes
    unchanged = min(int(rounds[r]["bytes"]) for r in range(1, len(rounds)) if not moved[r])
    row_bytes = 8 + 8 * 8 * 4 + 4  # digits: int64 position, 8x8 float32 features, int32 label
    for r in recut:
        assert int(rounds[r]["bytes"]) - unchanged >= moved[r] * row_bytes
    assert float(rounds[-1]["train_accuracy"]) > 0.8 and float(rounds[-1]["test_accuracy"]) > 0.8


def test_overlapped_evaluation_trains_the_same_and_drains_the_round_under_way_on_early_stop(tmp_path):
    plain = run_mpi(3, QUICK, tmp_path / "plain")
    overlap = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=8",
                          "--set", "train.overlap_eval=true", "--set", "early_stopping.patience=2",
                          "--set", "early_stopping.min_delta=0.5"], tmp_path / "overlap")
    assert plain.returncode == 0, plain.output
    assert overlap.returncode == 0, overlap.output
    summary = overlap.summary()
    # Round 0 sets the best; rounds 1 and 2 bring no 0.5 gain; round 3 was already running and is dropped.
    assert summary["stop_reason"] == "early_stopping" and summary["rounds_completed"] == 3
    assert summary["final_round"] == 0
    assert "round 3 was already under way when early stopping decided" in overlap.output
    for ours, theirs in zip(overlap.rounds(), plain.rounds(), strict=True):
        assert float(ours["test_accuracy"]) == pytest.approx(float(theirs["test_accuracy"]), rel=1e-6)
        assert ours["bytes"] == theirs["bytes"]  # the next round's dispatch is not billed to this one
    assert summary["traffic_bytes"] > plain.summary()["traffic_bytes"]  # the dropped round still cost traffic
