"""Real ``mpirun`` jobs that fail on purpose: a worker killed under ``launch`` and resumed, a stopped worker.
(NaN policies and a resume run in one process: tests/unit/trainer/.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from conftest import MPI_TIMEOUT, NO_PLOTS, ROOT, MpiResult, run_mpi, wait_for_rounds
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mpi_trainer.launch.mpirun import rank_pid
from mpi_trainer.persistence.checkpoint import load_checkpoint

QUICK = ["configs/quickstart.toml", "--set", "checkpoint.every=2", *NO_PLOTS]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
SCORES = ("test_loss", "test_accuracy", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "steps")


def signal_rank(proc: subprocess.Popen, rank: int, sig: int) -> int:
    pid = rank_pid(proc.pid, rank)
    assert pid is not None, "rank process not found"
    os.kill(pid, sig)
    return pid


def checkpoint_at_restart(run_dir: Path, into: Path, launcher: subprocess.Popen) -> None:
    """Copy the checkpoint files as the failed attempt left them, once ``launch`` has ended that attempt and
    is starting the next with ``--resume``: the next attempt reads them at set-up and writes its first
    checkpoint only after starting its processes and training two rounds, seconds later."""
    log, deadline = run_dir / "launch.log", time.monotonic() + MPI_TIMEOUT
    while "restarting with --resume" not in (log.read_text() if log.exists() else ""):
        assert launcher.poll() is None and time.monotonic() < deadline, \
            f"launch did not restart the job: {launcher.poll()}\n{launcher.communicate()[0]}"
        time.sleep(0.02)
    into.mkdir()
    for name in ("checkpoint.h5", "checkpoint.h5.bak", "fit.json"):
        if (run_dir / name).exists():
            shutil.copy2(run_dir / name, into / name)


def test_launch_resumes_after_a_worker_is_killed_and_trains_as_a_resume_without_a_kill(tmp_path):
    """(a) kill -9 of a worker under launch --max-restarts: every round once (in rounds.csv, TensorBoard and
    the timeline), resumed from the checkpoint the killed attempt left (not from scratch), and every round
    after it the same, to the last digit, as those of the job resumed from that checkpoint without a kill;
    the final weights too.

    Training here is deterministic: the data split is seeded, every rank seeds Keras with train.seed before it
    builds the model, so a worker's shuffles in Keras' fit follow from the epochs its process has trained, the
    MLP has no dropout, and the reference is the same job resumed by `train --resume` from a copy of the
    checkpoint, in processes of its own. A resumed run and an uninterrupted one part after the resume, though
    (new shuffles), and on the 360 test rows one round's accuracy moves by up to 2 pp from the next: the
    check of the model's quality below reads the mean of the last five rounds."""
    changes = {"train.epochs": 15, "checkpoint.every": 2, "aggregation.outer_optimizer": "none"}
    sets = [*QUICK, "--set", "log.timeline=true", *(f for key, value in changes.items()
                                                     for f in ("--set", f"{key}={value}"))]
    run_dir, reference_dir = tmp_path / "launched", tmp_path / "resumed_without_a_kill"
    command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", "--max-restarts", "2", *sets,
               "--run-dir", str(run_dir)]
    launcher = subprocess.Popen(command, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    wait_for_rounds(run_dir, 5, launcher)
    signal_rank(launcher, 2, signal.SIGKILL)
    checkpoint_at_restart(run_dir, reference_dir, launcher)
    output, _ = launcher.communicate(timeout=MPI_TIMEOUT)
    assert launcher.returncode == 0, output
    launched = MpiResult(0, output, run_dir)
    rows = launched.rounds()
    assert [int(r["round"]) for r in rows] == list(range(15))
    summary = launched.summary()
    assert summary["rounds_completed"] == 15
    # Killed after round 4 or a little later: resumed from an odd round's checkpoint (every 2 rounds),
    # the one the killed attempt left, not from scratch.
    resumed_after = summary["resumed_after_round"]
    assert resumed_after % 2 == 1 and 3 <= resumed_after < 14
    assert load_checkpoint(reference_dir / "checkpoint.h5")[1]["round"] == resumed_after
    assert len(summary["restarts"]) == 1 and "exited with status" in summary["restarts"][0]["cause"]
    assert "restarting with --resume" in (run_dir / "launch.log").read_text()
    assert f"resuming after round {resumed_after} " in (run_dir / "train.log").read_text()
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [event.step for event in events.Scalars("metrics/test_accuracy")] == list(range(15))
    trace = json.loads((run_dir / "timeline.json").read_text())["traceEvents"]
    trained = [(e["pid"], e["args"]["round"]) for e in trace if e.get("name") == "train"]
    # Attempt 1's timeline, last written some seconds before the kill, may miss a few rounds; none twice.
    rerun = set(range(resumed_after + 1, 15))
    assert len(trained) == len(set(trained)) and {r for _, r in trained} >= rerun
    # the same job resumed from the same checkpoint without a kill
    reference = run_mpi(3, ["train", *sets, "--resume"], run_dir=reference_dir)
    assert reference.returncode == 0, reference.output
    assert reference.summary()["resumed_after_round"] == resumed_after
    expected = [row for row in reference.rounds() if int(row["round"]) > resumed_after]  # the rounds it trained
    assert [int(r["round"]) for r in expected] == sorted(rerun)
    for got, want in zip(rows[resumed_after + 1:], expected, strict=True):
        assert {k: got[k] for k in SCORES} == {k: want[k] for k in SCORES}, got["round"]
    assert summary["final_test_accuracy"] == reference.summary()["final_test_accuracy"]
    np.testing.assert_array_equal(load_checkpoint(run_dir / "checkpoint.h5")[0]["state"],
                                  load_checkpoint(reference_dir / "checkpoint.h5")[0]["state"])
    # As good as an uninterrupted run (0.9794 over its last five rounds, 0.9749 to 0.9772 resumed after
    # round 3 to 7; single rounds 0.9638 to 0.9861): one round 2 pp off moves this mean by 0.4 pp.
    assert np.mean([float(r["test_accuracy"]) for r in rows[-5:]]) >= 0.95, rows[-5:]


def test_stopped_worker_ends_the_job_naming_its_rank(tmp_path):
    """(b) SIGSTOP of a worker: non-zero exit within worker_timeout + 30 s, naming the rank and host."""
    run_dir, timeout = tmp_path / "stopped", 20  # covers the first round, which compiles, on a busy CI node
    from mpi_trainer.launch.mpirun import mpirun_command

    command = mpirun_command(3, ["train", *QUICK, "--set", "train.epochs=500", "--set",
                                 f"watchdog.worker_timeout={timeout}", "--run-dir", str(run_dir)])
    job = subprocess.Popen(command, cwd=ROOT, env=ENV, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    wait_for_rounds(run_dir, 3, job)
    stopped = signal_rank(job, 2, signal.SIGSTOP)
    started = time.monotonic()
    output, _ = job.communicate(timeout=MPI_TIMEOUT)
    assert job.returncode != 0
    assert time.monotonic() - started < timeout + 30
    # Stopped while training or between rounds, rank 2 is named by rank 0's bounded wait (with rank 1 when
    # rank 1 waits for it inside the order's broadcast, which passes through rank 2); stopped inside the few
    # milliseconds of a transfer, MPI cannot say who is missing, and the transfer's guard names the
    # collective that every rank entered and that did not complete.
    waited = [line.split("(waiting for ", 1)[1] for line in output.splitlines()
              if "mpi_trainer: error:" in line and "(waiting for " in line]
    named = any(f"rank 2 on host {os.uname().nodename}" in line for line in waited)
    assert named or ("did not complete within" in output and "a peer stopped inside it" in output), output
    assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == psutil.STATUS_ZOMBIE

