"""Running real mpi_trainer jobs for the suites: ``mpirun ... python -m mpi_trainer train``."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT
from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

QUICKSTART = "configs/quickstart.toml"


class JobFailed(RuntimeError):
    """A benchmark job exited non-zero: its output is in the message."""


def train_command(ranks: int, config: str, overrides: list[str], run_dir: Path,
                  fault_tolerant: bool = False) -> list[str]:
    args = ["train", config, "--run-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    return mpirun_command(ranks, args, fault_tolerant=fault_tolerant)


def run_job(ranks: int, overrides: list[str], config: str = QUICKSTART,
            fault_tolerant: bool = False) -> tuple[dict[str, Any], list[dict], float]:
    """One job in a fresh run directory: (summary.json, rounds.csv rows, seconds the command took).
    ``fault_tolerant``: on Open MPI's fault-tolerant MPI (what ``fault.survive`` needs)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        proc = subprocess.run(train_command(ranks, config, overrides, run_dir, fault_tolerant), cwd=ROOT,
                              capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads((run_dir / "summary.json").read_text()), read_rounds(run_dir / "rounds.csv"), seconds


def after_first(rounds: list[dict], column: str) -> list[float]:
    """A rounds.csv column from round 1 on (round 0 traces the model's graphs)."""
    return [float(row[column]) for row in rounds[1:] if row.get(column, "") != ""]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
