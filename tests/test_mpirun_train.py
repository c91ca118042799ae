"""Real ``mpirun`` jobs on tiny data: one per aggregation method, plus failure paths."""

from __future__ import annotations

import pytest
from conftest import run_mpi

CONTROL_ALLOWANCE_PER_WORKER = 4096


def _model_bytes(summary: dict) -> int:
    return int(summary["model_bytes"])


@pytest.mark.parametrize("method", ["average", "weighted", "best"])
def test_each_method_trains_and_matches_traffic_minimum(method, tmp_path):
    run_dir = tmp_path / method
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", f"aggregation.method={method}",
                         "--set", "train.epochs=4", "--set", "checkpoint.every=2"], run_dir)
    assert result.returncode == 0, result.output
    summary = result.summary()
    rounds = result.rounds()
    assert summary["rounds_completed"] == 4 == len(rounds)
    assert [int(r["round"]) for r in rounds] == [0, 1, 2, 3]
    assert summary["workers"] == 2 and summary["aggregation"] == method and summary["ssp"] == 0
    assert summary["stop_reason"] == "epochs"
    accuracies = [float(r["test_accuracy"]) for r in rounds]
    assert accuracies[-1] > accuracies[0] and accuracies[-1] > 0.85
    model, workers = _model_bytes(summary), 2
    minimum = 2 * model * workers if method != "best" else model * (workers + 1)
    for row in rounds:
        sent = int(row["bytes"])
        assert minimum <= sent <= minimum * 1.01 + CONTROL_ALLOWANCE_PER_WORKER * workers, row
    for name in ("config.toml", "train.log", "checkpoint.h5", "final.weights.h5"):
        assert (run_dir / name).is_file(), name
    if method == "best":
        assert all(r["winner"] in ("1", "2") for r in rounds)
        assert "election" in (run_dir / "train.log").read_text()
