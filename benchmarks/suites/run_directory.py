"""What happens around one run directory: a second job, preemption, the same command again, changed data?"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import ENV, QUICKSTART, train_command
from mpi_trainer.launch.mpirun import rank_pid
from mpi_trainer.persistence.checkpoint import load_checkpoint
from mpi_trainer.persistence.run_files import read_rounds

QUESTION = "Run directories: a second job, preemption, the same command again, changed data"
REFUSED = 2  # the exit status of a job refused before training


def start(sets: list[str], run_dir: Path, launcher: bool = False) -> subprocess.Popen:
    """The quick start on 3 ranks, straight under mpirun or through ``mpi_trainer launch``."""
    if launcher:
        command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", QUICKSTART,
                   *[x for item in sets for x in ("--set", item)], "--run-dir", str(run_dir)]
    else:
        command = train_command(3, QUICKSTART, sets, run_dir)
    return subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def rounds(run_dir: Path) -> list[int]:
    path = run_dir / "rounds.csv"
    return [int(row["round"]) for row in read_rounds(path)] if path.exists() else []


def each_once(run_dir: Path) -> bool:
    done = rounds(run_dir)
    return done == list(range(len(done)))


def wait_rounds(proc: subprocess.Popen, run_dir: Path, count: int, limit: float = 600.0) -> None:
    deadline = time.monotonic() + limit
    while len(rounds(run_dir)) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the job ended or stalled (exit {proc.poll()}) before round {count - 1}")
        time.sleep(0.05)


def second_job(sets: list[str], base: Path) -> Figures:
    """A second job on a directory whose job is training: seconds from its start to its refusal."""
    first = start([*sets, "train.epochs=200"], base)
    try:
        wait_rounds(first, base, 1)
        started = time.perf_counter()
        code = start(sets, base).wait()
        seconds = time.perf_counter() - started
        os.kill(rank_pid(first.pid, 0), signal.SIGTERM)  # preempted: it checkpoints and exits
        first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    return {"seconds": seconds, "lost": 0, "exit": code, "expected": float(code == REFUSED and each_once(base))}


def preempt(target: str, sets: list[str], base: Path) -> Figures:
    """SIGTERM once 3 rounds are written; rounds lost = the last round written minus the checkpoint's;
    ``expected``: the same command again completes with every round once."""
    launcher = target == "launch"
    proc = start(sets, base, launcher)
    wait_rounds(proc, base, 3)
    os.kill(proc.pid if launcher else rank_pid(proc.pid, 0 if target == "rank 0" else 2), signal.SIGTERM)
    started = time.perf_counter()
    code = proc.wait(timeout=300)
    seconds = time.perf_counter() - started
    lost = rounds(base)[-1] - load_checkpoint(base / "checkpoint.h5")[1]["round"]
    again = start(sets, base, launcher).wait()
    return {"seconds": seconds, "lost": lost, "exit": code, "expected": float(again == 0 and each_once(base))}


def rerun_complete(sets: list[str], base: Path) -> Figures:
    """The same command after the run completed: it exits 0 and touches nothing."""
    start(sets, base).wait()
    files = ("rounds.csv", "checkpoint.h5", "summary.json")
    before = {name: (base / name).stat().st_mtime_ns for name in files}
    started = time.perf_counter()
    code = start(sets, base).wait()
    untouched = before == {name: (base / name).stat().st_mtime_ns for name in files}
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "lost": 0, "exit": code, "expected": float(code == 0 and untouched)}


def changed_data(sets: list[str], base: Path) -> Figures:
    """Resume after the data file was replaced by another of the same name and size: refused."""
    data, rng = base.parent / "data.npz", np.random.default_rng(0)
    np.savez(data, x=rng.normal(size=(300, 8)).astype(np.float32), y=rng.integers(0, 3, size=300))
    more = [*sets, f"data.source={data}"]
    start(more, base).wait()
    np.savez(data, x=rng.normal(size=(300, 8)).astype(np.float32), y=rng.integers(0, 3, size=300))
    started = time.perf_counter()
    code = start([*more, "train.epochs=20"], base).wait()
    return {"seconds": time.perf_counter() - started, "lost": 0, "exit": code, "expected": float(code == REFUSED)}


def in_scratch(scenario: Callable[[list[str], Path], Figures], sets: list[str]) -> Callable[[], Figures]:
    def run() -> Figures:
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            return scenario(sets, Path(tmp) / "run")
    return run


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 6 if quick else 8
    # A short sleep after every batch (a test hook) so that a signal lands mid-run.
    sets = [f"train.epochs={epochs}", "checkpoint.every=0", "debug.batch_delay=0.04", "log.plots=false"]
    scenarios = {
        "second job started on a run directory in use": second_job,
        "SIGTERM to a worker": lambda s, b: preempt("a worker", s, b),
        "SIGTERM to rank 0": lambda s, b: preempt("rank 0", s, b),
        "SIGTERM to `launch`": lambda s, b: preempt("launch", s, b),
        "the same command after the run completed": rerun_complete,
        "resume after the data file was replaced (same name and size)": changed_data,
    }
    return [Comparison(
        title=f"The quick start (MLP on digits, 2 workers, {epochs} rounds) around one run directory",
        command=f"python -m benchmarks run run_directory{' --quick' if quick else ''}",
        variants={name: in_scratch(scenario, sets) for name, scenario in scenarios.items()},
        columns={"seconds": "s to detect", "lost": "rounds lost", "exit": "exit code",
                 "expected": "outcome as documented (1 = yes)"},
        notes="s to detect: from the event to the refusal, or to every process's exit. A second job is refused "
              "before it loads data, naming the holder; a preempted job checkpoints and exits 75, and the same "
              "command again completes with every round once; a completed run is left untouched; changed data "
              "is refused on resume.")]
