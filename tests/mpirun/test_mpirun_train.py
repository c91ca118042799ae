"""Real ``mpirun`` jobs on tiny data: weighted averaging with a user model imported on every rank, whose
rounds move the fewest bytes MPI can, and a raising worker. Tested in one process instead: averaging,
best-of election, early stopping and the 16-bit wire (tests/unit/trainer/), refusals of bad config
(tests/unit/launch/test_agreement.py); bad data found at set-up: test_mpirun_data.py."""

from __future__ import annotations

import re
import time

from conftest import ROOT, run_mpi

CONTROL_ALLOWANCE_PER_WORKER = 4096


def _model_bytes(summary: dict) -> int:
    return int(summary["model_bytes"])


def check_trained(result, run_dir, method: str) -> dict:
    """Four rounds of ``method`` trained and checkpointed, each round moving the fewest bytes it can."""
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
    for index, row in enumerate(rounds):
        # up and back down, one model per worker each way (the combined state returns with the sum); before
        # the first round the initial state down as well
        minimum = (3 if index == 0 else 2) * model * workers
        sent = int(row["bytes"])
        assert minimum <= sent <= minimum * 1.01 + CONTROL_ALLOWANCE_PER_WORKER * workers, row
    for name in ("config.toml", "train.log", "checkpoint.h5", "final.weights.h5"):
        assert (run_dir / name).is_file(), name
    # rank 0 waited on the workers' rounds, sleeping between polls: a small part of one core, not a spinning one
    assert summary["scheduler_wait_seconds"] > 0  # from the job's start, its set-up's waits included
    assert 0 <= summary["scheduler_wait_cpu_fraction"] < 0.5
    return summary


def test_a_user_model_by_module_path_trains_by_weighted_average_on_every_rank(tmp_path, tiny_npz):
    run_dir = tmp_path / "run"
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", f"data.source='{tiny_npz}'",
                         "--set", "model.name=user_models:small_cnn", "--set", "aggregation.method=weighted",
                         "--set", "train.epochs=4", "--set", "checkpoint.every=2"],
                     run_dir, extra_env={"PYTHONPATH": str(ROOT / "tests")})
    summary = check_trained(result, run_dir, "weighted")
    assert "input (8, 8, 1), 3 classes" in summary["dataset"]


def test_a_raising_worker_ends_the_whole_job_with_its_rank_and_traceback(tmp_path):
    started = time.perf_counter()
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "model.name=user_models:fails_on_rank",
                         "--set", "train.epochs=50"], tmp_path / "run", timeout=120,
                     extra_env={"PYTHONPATH": str(ROOT / "tests"), "MPI_TRAINER_TEST_FAIL_RANK": "2"})
    assert result.returncode != 0
    assert re.search(r"mpi_trainer: rank 2 of 3 on \S+ failed:", result.output), result.output
    assert "injected failure in a user layer" in result.output and "Traceback" in result.output
    assert time.perf_counter() - started < 90
    assert not (tmp_path / "run" / "summary.json").exists() or "epochs" not in \
        (tmp_path / "run" / "summary.json").read_text()
