"""``mpi_trainer.fit`` from a script under ``mpirun -n 3``: shared and scattered arrays, a stopping
callback, a Keras script, what fit refuses (on every rank, before training) and models built before fit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mpi_trainer.launch.mpirun import find_mpirun

JOB = ROOT / "tests" / "mpirun" / "fit_job.py"


def run_fits(run_dir, modes: str, timeout: float = 240,
             **env_vars: str) -> tuple[int, dict[str, dict[int, dict]], str]:
    """``fit_job.py`` under ``mpirun -n 3`` with ``modes`` (comma-separated); what each rank printed, by
    mode and rank."""
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env_vars}
    proc = subprocess.run([*command, sys.executable, str(JOB), str(run_dir), modes], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    results: dict[str, dict[int, dict]] = {}
    for line in proc.stdout.splitlines():
        if line.startswith('{"rank"'):
            printed = json.loads(line)
            results.setdefault(printed["mode"], {})[printed["rank"]] = printed["result"]
    return proc.returncode, results, proc.stdout + proc.stderr


def run_fit(run_dir, mode: str, timeout: float = 240, **env_vars: str) -> tuple[int, dict[int, dict], str]:
    code, results, output = run_fits(run_dir, mode, timeout, **env_vars)
    return code, results.get(mode, {}), output


# One job runs these one after another in the same processes, each in its own run directory (a script
# may call fit more than once): a refusal on every rank, then two trainings and a Keras script.
SCRIPTED = ("refusals", "shared", "scattered", "keras")


@pytest.fixture(scope="module")
def scripted(tmp_path_factory) -> tuple[dict[str, dict[int, dict]], str, Path]:
    """What each rank's fit returned in each of the SCRIPTED modes, the job's output and its directory."""
    base = tmp_path_factory.mktemp("scripted")
    code, results, output = run_fits(base, ",".join(SCRIPTED), timeout=480)
    assert code == 0, output
    return results, output, base


def test_fit_returns_the_same_history_and_trained_model_on_every_rank_and_a_callback_stops_them(scripted):
    results, output, base = scripted[0]["shared"], scripted[1], scripted[2]
    assert sorted(results) == [0, 1, 2], output
    result = results[0]
    assert result["epochs_seen"] == [0, 1] and result["summary"]["stop_reason"] == "callback"
    history = result["history"]
    assert set(history) == {"loss", "accuracy"} and len(history["loss"]) == 2  # no validation data: no val_*
    assert result["epoch"] == [0, 1] and result["rounds"]["round"] == [0.0, 1.0]
    assert {"wall_seconds", "bytes", "train_loss"} <= set(result["rounds"])
    assert result["model_accuracy"] > 0.7 and result["same_model"]  # the model passed in holds the weights
    for worker in (1, 2):  # every rank: the same History, the same final weights in its own model
        assert results[worker]["history"] == history and results[worker]["run_dir"] == result["run_dir"]
        assert abs(results[worker]["model_loss"] - result["model_loss"]) < 1e-6
    log = (base / "shared" / "train.log").read_text()
    assert "scatter: sent" not in log  # both workers had the arrays: only block bounds travelled
    assert "fit: 1797 training rows (arrays), in 2 shares of 29 batches an epoch; no validation data" in log


def test_a_keras_script_ports_unchanged_early_stopping_restores_the_best_round_and_workers_follow_the_lr(scripted):
    results = scripted[0]["keras"]
    result = results[0]
    history = result["history"]
    # LearningRateScheduler adds learning_rate to the logs, as in model.fit
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"}, history
    best = min(range(len(history["val_loss"])), key=history["val_loss"].__getitem__)
    assert result["best_epoch"] == best
    for rank in (0, 1, 2):  # the unbuilt Sequential was built and holds the best round's weights everywhere
        assert results[rank]["history"] == history
        assert abs(results[rank]["model_loss"] - history["val_loss"][best]) < 1e-4, (rank, results[rank], history)
    # the learning rate each worker trained with, as it reported it: the scheduler callback's, round by round
    rates = result["rounds"]["learning_rate"]
    assert rates == pytest.approx([0.4, 0.4] + [0.8] * (len(rates) - 2)), rates


def test_what_fit_refuses_fails_every_rank_before_training_one_job_after_another(scripted):
    results, output, base = scripted[0]["refusals"], scripted[1], scripted[2]
    assert sorted(results) == [0, 1, 2], output  # each refusal raised on every rank; none hung
    raised = {rank: results[rank]["raised"] for rank in results}
    for rank in (0, 1, 2):
        assert "Data cardinality is ambiguous" in raised[rank]["refused"], raised  # Keras' own words
        assert "'sample_weight' sizes: 10" in raised[rank]["refused"], raised
        # the dry run of every rank finds it
        assert ("do not fit together: model output shape (None, 10), labels of shape () per sample and dtype "
                "int64, loss 'categorical_crossentropy'") in raised[rank]["mismatch"], raised
        # rank 2 alone passed x without y: the others fail too, naming it, instead of waiting for it
        assert raised[rank]["half_arguments"].startswith("`x` and `y` go together. Received: x=ndarray"), raised
        assert "builds a model for one input array and one target array. Received: dict" in raised[rank]["by_name"]
        assert raised[rank]["no_x"].startswith("`validation_data` goes with `x`"), raised
    assert [("(reported by rank 2)" in raised[rank]["half_arguments"]) for rank in (0, 1, 2)] == [True, True, False]
    assert not (base / "refusals").exists()  # nothing was written: every refusal came before the run directory


def test_fit_with_arrays_only_on_the_scheduler_sends_them_to_the_workers_and_trains_a_regression(scripted):
    results, output = scripted[0]["scattered"], scripted[1]
    result = results[0]
    mae = result["history"]["val_mae"]
    assert len(mae) == 3 and mae[-1] < mae[0], mae
    assert len(result["history"]["mae"]) == 3 and result["summary"]["rounds_completed"] == 3
    assert results[1]["model_mae"] == result["model_mae"]  # a worker's copy holds the same final weights
    assert "the workers passed no arrays or others: rank 0's were sent to every worker" in output


def test_a_model_built_before_fit_trains_and_the_log_says_its_threads_were_not_sized(tmp_path):
    code, results, output = run_fit(tmp_path / "run", "built")
    assert code == 0, output
    placement = results[0]["summary"]["placement"]
    assert [p["threads"] for p in placement] == [None, None, None]  # TensorFlow had started on every rank
    log = (tmp_path / "run" / "train.log").read_text()
    assert "ranks 0, 1, 2: the Keras backend had started before the job could size its threads" in log
    assert "call mpi_trainer.init() at the top of the script" in log


def test_a_model_built_before_fit_on_a_node_with_gpus_is_refused_on_every_rank(tmp_path):
    # Two GPUs as a batch system hands them over: the started backend would see both on every rank.
    code, results, output = run_fit(tmp_path / "run", "built", timeout=120, CUDA_VISIBLE_DEVICES="0,1")
    assert code != 0 and not results
    printed = [line for line in output.splitlines() if line.startswith("mpi_trainer: error: rank ")
               and "started before mpi_trainer dealt this node's 2 GPUs to its ranks" in line]
    assert len(printed) == 3 and all("expected `mpi_trainer.init()` at the top of the script" in line
                                     for line in printed), output
    assert not (tmp_path / "run").exists()


def test_init_places_every_rank_before_keras_starts_and_a_later_job_cannot_move_them(tmp_path):
    code, results, output = run_fit(tmp_path / "run", "init_built")
    placement = results[0]["summary"]["placement"]
    cores = os.cpu_count()
    assert [(p["rank"], p["threads"]) for p in placement] == [(0, cores), (1, 1), (2, 1)], output
    assert "could size its threads" not in (tmp_path / "run" / "train.log").read_text()
    # the second job asked for train.threads=2: refused on every rank, before anything was written
    assert code != 0
    printed = [line for line in output.splitlines() if line.startswith(
        "mpi_trainer: error: `train.threads` differs from the placement this process already has")]
    assert len(printed) == 3 and all("Received: train.threads=2; expected 1" in line for line in printed), output
    assert not (tmp_path / "run-again").exists()
