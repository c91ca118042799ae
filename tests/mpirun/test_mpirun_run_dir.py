"""Real ``mpirun`` jobs around one run directory: two jobs at once, preemption, reruns, changed data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import MPI_TIMEOUT, ROOT, MpiResult, run_mpi, wait_for_rounds

from mpi_trainer.config.loader import read_toml
from mpi_trainer.launch.mpirun import mpirun_command, rank_pid
from mpi_trainer.persistence.checkpoint import load_checkpoint
from mpi_trainer.persistence.run_files import read_rounds

ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
# What a run directory holds does not depend on the worker count: these jobs run one worker.
RANKS = 2
# 8 rounds of about a second each (a short sleep after every batch), so that a signal lands mid-run
SLOW = ["configs/quickstart.toml", "--set", "train.epochs=8", "--set", "debug.batch_delay=0.02",
        "--set", "checkpoint.every=0", "--set", "log.plots=false"]
EXIT_PREEMPTED = 75


def start(args: list[str], run_dir: Path, launcher: bool = False) -> subprocess.Popen:
    if launcher:
        command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", str(RANKS), *args, "--run-dir", str(run_dir)]
    else:
        command = mpirun_command(RANKS, ["train", *args, "--run-dir", str(run_dir)])
    return subprocess.Popen(command, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    output, _ = proc.communicate(timeout=MPI_TIMEOUT)
    return proc.returncode, output


def round_numbers(run_dir: Path) -> list[int]:
    return [int(row["round"]) for row in read_rounds(run_dir / "rounds.csv")]


def test_two_jobs_started_together_on_one_new_run_directory(tmp_path):
    run_dir = tmp_path / "shared"
    # the winner trains for 15 s or more: far longer than the two jobs' start-up times differ
    slower = [*SLOW, "--set", "debug.batch_delay=0.04"]
    jobs = [start(slower, run_dir), start(slower, run_dir)]
    (first, first_out), (second, second_out) = finish(jobs[0]), finish(jobs[1])
    assert sorted([first, second]) == [0, 2], first_out + second_out
    refused = first_out if first == 2 else second_out
    assert "The run directory is in use by another job: host " in refused and " pid " in refused
    assert round_numbers(run_dir) == list(range(8))  # each round once
    assert MpiResult(0, "", run_dir).summary()["workers"] == 1


def test_preemption_of_a_worker_then_of_rank_0_and_reruns_that_finish_the_run(tmp_path):
    run_dir = tmp_path / "preempted"
    job = start(SLOW, run_dir)
    wait_for_rounds(run_dir, 2, job)
    os.kill(rank_pid(job.pid, 1), signal.SIGTERM)
    code, output = finish(job)
    assert code == EXIT_PREEMPTED, output
    first = round_numbers(run_dir)
    assert first == list(range(len(first))) and 2 <= len(first) < 8
    assert load_checkpoint(run_dir / "checkpoint.h5")[1]["round"] == first[-1]  # nothing done is lost
    assert MpiResult(0, "", run_dir).summary()["stop_reason"] == "preempted"

    job = start(SLOW, run_dir)  # the same command again resumes; this time rank 0 is signalled
    wait_for_rounds(run_dir, len(first) + 1, job)
    os.kill(rank_pid(job.pid, 0), signal.SIGTERM)
    code, output = finish(job)
    assert code == EXIT_PREEMPTED, output
    second = round_numbers(run_dir)
    assert second == list(range(len(second))) and len(second) > len(first)

    code, output = finish(start(SLOW, run_dir))
    assert code == 0, output
    assert round_numbers(run_dir) == list(range(8))
    summary = MpiResult(0, "", run_dir).summary()
    assert summary["completed"] and summary["resumed_after_round"] == second[-1]


def test_rerunning_launch_after_it_was_terminated_resumes_the_run(tmp_path):
    run_dir = tmp_path / "launched"
    launcher = start(SLOW, run_dir, launcher=True)
    wait_for_rounds(run_dir, 2, launcher)
    launcher.send_signal(signal.SIGTERM)  # as Slurm does before a requeue
    code, output = finish(launcher)
    assert code == EXIT_PREEMPTED, output
    stopped_at = round_numbers(run_dir)[-1]
    assert stopped_at < 7 and "asking the job to checkpoint" in (run_dir / "launch.log").read_text()

    code, output = finish(start(SLOW, run_dir, launcher=True))
    assert code == 0, output
    assert "Run directory already holds a run" not in output
    assert round_numbers(run_dir) == list(range(8))
    assert MpiResult(0, "", run_dir).summary()["resumed_after_round"] == stopped_at


def _labels_npz(path: Path, seed: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 8)).astype(np.float32)
    y = np.random.default_rng(seed).integers(0, 3, size=300)
    np.savez(path, x=x, y=y)


def test_a_complete_run_trains_nothing_again_and_changed_data_is_refused_before_any_file_changes(tmp_path):
    data, run_dir = tmp_path / "data.npz", tmp_path / "run"
    _labels_npz(data, 1)
    args = ["train", "configs/quickstart.toml", "--set", f"data.source={data}", "--set", "train.epochs=2",
            "--set", "log.plots=false"]
    assert run_mpi(RANKS, args, run_dir).returncode == 0
    files = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}

    again = run_mpi(RANKS, args, run_dir)
    assert again.returncode == 0, again.output
    assert "is complete (stop_reason epochs after 2 rounds); nothing to train" in again.output
    assert round_numbers(run_dir) == [0, 1]
    changed = {p.name for p in run_dir.iterdir() if files.get(p.name) != p.stat().st_mtime_ns}
    assert changed <= {"train.log", "run.lock"}  # the log says so; the results stay as they were
    files = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}

    _labels_npz(data, 2)  # the same file name and size, other labels
    refused = run_mpi(RANKS, [*args, "--set", "train.epochs=4"], run_dir)
    assert refused.returncode == 2, refused.output
    assert "holds the run of another fit: its data differ from this call's" in refused.output
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir() if p.name != "run.lock"} == \
        {k: v for k, v in files.items() if k != "run.lock"}


def test_launch_supervises_a_fit_script_and_restarts_it_after_a_worker_dies(tmp_path):
    run_dir = tmp_path / "script"
    command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", str(RANKS), "--max-restarts", "1", "--run-dir",
               str(run_dir), "--set", "checkpoint.every=2", "--", sys.executable, "tests/mpirun/launch_fit_job.py"]
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    launcher = subprocess.Popen(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)  # the script imports this checkout's mpi_trainer
    wait_for_rounds(run_dir, 3, launcher)
    os.kill(rank_pid(launcher.pid, 1), signal.SIGKILL)
    code, output = finish(launcher)
    assert code == 0, output
    assert round_numbers(run_dir) == list(range(8))
    assert '{"rounds": 8, "run_dir": "' + str(run_dir) + '"}' in output  # fit found the launcher's directory
    summary = MpiResult(0, "", run_dir).summary()
    # checkpoints every 2 rounds, as the launcher's --set asked the script's fit
    assert summary["resumed_after_round"] % 2 == 1 and len(summary["restarts"]) == 1
    assert read_toml(run_dir / "config.toml")["checkpoint"]["every"] == 2
