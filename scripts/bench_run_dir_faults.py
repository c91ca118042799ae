"""Measure what happens around one run directory: a second job, preemption, reruns, changed data.

    .venv/bin/python scripts/bench_run_dir_faults.py [--epochs 8] [--batch-delay 0.04]

Each scenario runs the quickstart (digits, 3 ranks) with a short sleep after every batch so
that a signal lands mid-run, and prints one markdown row of docs/fault-tolerance.md's
reliability table: scenario, time to detect (from the event to the refusal or to every
process's exit), rounds lost (rounds run again after the restart, or trained for nothing),
outcome.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mpi_trainer.launch.mpirun import mpirun_command, rank_pid
from mpi_trainer.persistence.checkpoint import load_checkpoint
from mpi_trainer.persistence.run_files import read_rounds

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def job(args: list[str], run_dir: Path, launcher: bool = False) -> subprocess.Popen:
    tail = [*args, "--run-dir", str(run_dir)]
    command = ([sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", *tail] if launcher
               else mpirun_command(3, ["train", *tail]))
    return subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rounds(run_dir: Path) -> list[int]:
    path = run_dir / "rounds.csv"
    return [int(r["round"]) for r in read_rounds(path)] if path.exists() else []


def wait_rounds(run_dir: Path, count: int) -> None:
    while len(rounds(run_dir)) < count:
        time.sleep(0.05)


def row(scenario: str, seconds: float, lost: int, outcome: str) -> None:
    print(f"| {scenario} | {seconds:.1f} s | {lost} | {outcome} |", flush=True)


def second_job(args: list[str], base: Path) -> None:
    """A second job on a directory whose job is training: seconds from its start to its refusal."""
    first = job([*args, "--set", "train.epochs=200"], base / "two")  # still training when the second asks
    wait_rounds(base / "two", 1)
    started = time.perf_counter()
    code = job(args, base / "two").wait()
    seconds = time.perf_counter() - started
    os.kill(rank_pid(first.pid, 0), signal.SIGTERM)  # preempted: it checkpoints and exits 75
    first.wait()
    once = rounds(base / "two") == list(range(len(rounds(base / "two"))))
    row("second job started on a run directory in use", seconds, 0,
        f"{'refused' if code == 2 else 'NOT refused'} (exit {code}) before loading data, naming the holder's "
        f"host and pid; the first job went on, each round once: {once}")


def preempt(args: list[str], base: Path, name: str, target: str) -> None:
    run_dir = base / name
    proc = job(args, run_dir, launcher=target == "launch")
    wait_rounds(run_dir, 3)
    pid = proc.pid if target == "launch" else rank_pid(proc.pid, 0 if target == "rank 0" else 2)
    os.kill(pid, signal.SIGTERM)
    started = time.perf_counter()
    code = proc.wait()
    seconds = time.perf_counter() - started
    done = rounds(run_dir)
    lost = done[-1] - load_checkpoint(run_dir / "checkpoint.h5")[1]["round"]
    rerun = job(args, run_dir, launcher=target == "launch")
    rerun.wait()
    row(f"SIGTERM to {target}", seconds, lost, f"checkpoint after round {done[-1]}, exit {code}; the same command "
        f"again: exit {rerun.returncode}, rounds 0-{rounds(run_dir)[-1]} each once: "
        f"{rounds(run_dir) == list(range(len(rounds(run_dir))))}")


def rerun_complete_and_changed_data(args: list[str], base: Path) -> None:
    run_dir = base / "done"
    job(args, run_dir).wait()
    before = {name: (run_dir / name).stat().st_mtime_ns for name in ("rounds.csv", "checkpoint.h5", "summary.json")}
    started = time.perf_counter()
    code = job(args, run_dir).wait()
    after = {name: (run_dir / name).stat().st_mtime_ns for name in before}
    row("the same command after the run completed", time.perf_counter() - started, 0,
        f"exit {code}; rounds.csv, checkpoint.h5 and summary.json untouched: {before == after}")
    data = base / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(data, x=rng.normal(size=(300, 8)).astype(np.float32), y=rng.integers(0, 3, size=300))
    more = [*args, "--set", f"data.source={data}"]
    job(more, base / "data").wait()
    np.savez(data, x=rng.normal(size=(300, 8)).astype(np.float32), y=rng.integers(0, 3, size=300))
    started = time.perf_counter()
    code = job([*more, "--set", "train.epochs=20"], base / "data").wait()
    row("resume after the data file was replaced (same name and size)", time.perf_counter() - started, 0,
        f"{'refused' if code == 2 else 'NOT refused'} (exit {code})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-delay", type=float, default=0.04)
    options = parser.parse_args()
    args = ["configs/quickstart.toml", "--set", f"train.epochs={options.epochs}", "--set", "checkpoint.every=0",
            "--set", f"debug.batch_delay={options.batch_delay}", "--set", "log.plots=false"]
    print("| Scenario | Time to detect | Rounds lost | Outcome |\n|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        second_job(args, base)
        for target in ("a worker", "rank 0", "launch"):
            preempt(args, base, target.replace(" ", "_"), target)
        rerun_complete_and_changed_data(args, base)


if __name__ == "__main__":
    main()
