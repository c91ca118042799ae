"""Measure how fast a failed worker ends or restarts a job, side by side in one run.

    .venv/bin/python scripts/bench_failure_detection.py [--timeout 10] [--epochs 40]

1. kill -9 of a worker, no watchdog: seconds from the kill to mpirun's exit
   (Open MPI notices the dead process itself).
2. SIGSTOP of a worker with ``watchdog.worker_timeout = T``: seconds from the
   stop to mpirun's exit, and that time over T.
3. ``launch --max-restarts 1`` with a worker killed after round 5, against the
   same job uninterrupted: wall time and final accuracy of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.launch.mpirun import rank_pid as find_rank_pid
from mpi_trainer.persistence.run_files import read_rounds

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def rank_pid(parent: int, rank: int) -> int:
    pid = find_rank_pid(parent, rank)
    if pid is None:
        raise RuntimeError(f"rank {rank} not found under pid {parent}")
    return pid


def wait_rounds(run_dir: Path, count: int) -> None:
    while not (run_dir / "rounds.csv").exists() or len(read_rounds(run_dir / "rounds.csv")) < count:
        time.sleep(0.05)


def time_to_exit(command: list[str], run_dir: Path, sig: int) -> tuple[float, int]:
    """Start ``command``, send ``sig`` to worker rank 2 after 3 rounds; seconds until the job exits."""
    job = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_rounds(run_dir, 3)
    os.kill(rank_pid(job.pid, 2), sig)
    started = time.perf_counter()
    job.wait()
    return time.perf_counter() - started, job.returncode


def timed_job(command: list[str], run_dir: Path, kill_after: int | None) -> tuple[float, float]:
    started = time.perf_counter()
    job = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if kill_after is not None:
        wait_rounds(run_dir, kill_after)
        os.kill(rank_pid(job.pid, 2), signal.SIGKILL)
    if job.wait() != 0:
        raise RuntimeError(f"job failed: {command}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return time.perf_counter() - started, summary["final_test_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="watchdog.worker_timeout for the SIGSTOP case")
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-failure-"))
    base = ["train", "configs/quickstart.toml", "--set", "checkpoint.every=2"]
    endless = [*base, "--set", "train.epochs=100000"]

    killed, code = time_to_exit(mpirun_command(3, [*endless, "--run-dir", str(work / "k")]), work / "k",
                                signal.SIGKILL)
    print(f"kill -9 of a worker: job ended {killed:.2f} s later (exit status {code})")
    stop_args = [*endless, "--set", f"watchdog.worker_timeout={args.timeout:g}", "--run-dir", str(work / "s")]
    stopped, code = time_to_exit(mpirun_command(3, stop_args), work / "s", signal.SIGSTOP)
    print(f"SIGSTOP of a worker, worker_timeout={args.timeout:g} s: job ended {stopped:.2f} s later "
          f"(exit status {code}), {stopped / args.timeout:.3f} x the timeout")

    finite = [*base, "--set", f"train.epochs={args.epochs}"]
    plain_seconds, plain_acc = timed_job(mpirun_command(3, [*finite, "--run-dir", str(work / "u")]),
                                         work / "u", None)
    launch = [sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", "--max-restarts", "1", *finite[1:],
              "--run-dir", str(work / "l")]
    launch_seconds, launch_acc = timed_job(launch, work / "l", 6)
    print(f"uninterrupted: {plain_seconds:.1f} s, final accuracy {plain_acc:.4f}")
    print(f"launch, worker killed after round 5: {launch_seconds:.1f} s, final accuracy {launch_acc:.4f}")
    print(f"ratio launched/uninterrupted wall time: {launch_seconds / plain_seconds:.2f}; "
          f"accuracy difference {100 * (launch_acc - plain_acc):+.2f} pp")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
