"""Running what the suites measure: ``mpirun ... python -m mpi_trainer train`` jobs, and the
suites' own programs (``python -m benchmarks.<program>``), which print their figures as one JSON line."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, Figures
from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

QUICKSTART = "configs/quickstart.toml"
MNIST_LENET = "configs/mnist_lenet.toml"
# Programs started by mpirun import this checkout's mpi_trainer and benchmarks, and TensorFlow stays quiet.
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


class JobFailed(RuntimeError):
    """A benchmark job exited non-zero: its output is in the message."""


def train_command(ranks: int, config: str, overrides: list[str], run_dir: Path,
                  fault_tolerant: bool = False, mpirun_args: list[str] | None = None) -> list[str]:
    args = ["train", config, "--run-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    return mpirun_command(ranks, args, extra=mpirun_args, fault_tolerant=fault_tolerant)


def run_job(ranks: int, overrides: list[str], config: str = QUICKSTART, fault_tolerant: bool = False,
            mpirun_args: list[str] | None = None) -> tuple[dict[str, Any], list[dict], float]:
    """One job in a fresh run directory: (summary.json, rounds.csv rows, seconds the command took).
    ``fault_tolerant``: on Open MPI's fault-tolerant MPI (what ``fault.survive`` needs);
    ``mpirun_args``: more mpirun options (e.g. the simulated hosts of the bandwidth suite)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        proc = subprocess.run(train_command(ranks, config, overrides, run_dir, fault_tolerant, mpirun_args),
                              cwd=ROOT, env=ENV, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads((run_dir / "summary.json").read_text()), read_rounds(run_dir / "rounds.csv"), seconds


def program(module: str, args: list[str], ranks: int = 0, env: dict[str, str] | None = None,
            mpirun_args: list[str] | None = None) -> dict[str, Any]:
    """``python -m benchmarks.<module> ARGS`` (under ``mpirun -n ranks`` when ranks > 0): its last JSON line."""
    command = [sys.executable, "-m", f"benchmarks.{module}", *args]
    if ranks:
        command = mpirun_command(ranks, [], extra=mpirun_args, program=command)
    proc = subprocess.run(command, cwd=ROOT, env={**ENV, **(env or {})}, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise JobFailed(f"{module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def after_first(rounds: list[dict], column: str) -> list[float]:
    """A rounds.csv column from round 1 on (round 0 traces the model's graphs)."""
    return [float(row[column]) for row in rounds[1:] if row.get(column, "") != ""]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def curve(rounds: list[dict]) -> list[tuple[float, float]]:
    """(elapsed seconds, test accuracy) of every scored round."""
    return [(float(row["elapsed_seconds"]), float(row["test_accuracy"])) for row in rounds
            if row.get("test_accuracy", "") != "" and not math.isnan(float(row["test_accuracy"]))]


def time_to(points: list[tuple[float, float]], target: float) -> float:
    """Elapsed seconds at the first score at or above ``target``; infinite if never reached, so that a
    miss counts as longer than any hit in a median. Accuracies are logged from float32 (0.96 reads
    0.9599999785), so they are compared at that precision."""
    return next((elapsed for elapsed, accuracy in points if accuracy >= target - 1e-6), math.inf)


def epochs_to(points: list[tuple[float, float]], target: float) -> float:
    """How many scored epochs it took to reach ``target`` (the first at or above it counts; infinite if
    never reached): convergence per epoch, apart from what an epoch costs."""
    return next((float(count) for count, (_, accuracy) in enumerate(points, 1) if accuracy >= target - 1e-6),
                math.inf)


def seeded(measure: Callable[[int], Figures]) -> Callable[[], Figures]:
    """A variant whose n-th repeat runs with seed n: the medians are then over seeds 0, 1, 2..., as
    the epoch that first crosses a target depends on the seed as much as on the method."""
    seeds = itertools.count()
    return lambda: measure(next(seeds))
