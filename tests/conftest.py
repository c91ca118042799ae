"""Shared fixtures: tiny datasets on disk and a bounded ``mpirun`` runner."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

ROOT = Path(__file__).resolve().parents[1]
MPI_TIMEOUT = 240
# Drawing the end-of-run plots costs each job seconds: test jobs draw them only where a test asks
# for them (``--set log.plots=true``, as tests/mpirun/test_mpirun_observe.py does).
NO_PLOTS = ["--set", "log.plots=false"]


def without_plots(args: list[str]) -> list[str]:
    """``args`` of ``mpi_trainer train`` or ``launch`` with ``log.plots=false`` unless they set it."""
    if args[:1] not in (["train"], ["launch"]) or any(arg.startswith("log.plots=") for arg in args):
        return list(args)
    return [*args, *NO_PLOTS]


@dataclass
class MpiResult:
    returncode: int
    output: str
    run_dir: Path

    def rounds(self) -> list[dict[str, str]]:
        return read_rounds(self.run_dir / "rounds.csv")

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())


def run_mpi(ranks: int, args: list[str], run_dir: Path | None = None, timeout: float = MPI_TIMEOUT,
            extra_env: dict[str, str] | None = None, machinefile: str | None = None,
            mpirun_args: list[str] | None = None) -> MpiResult:
    """Run ``mpirun -n ranks python -m mpi_trainer ARGS`` (without plots unless ARGS set ``log.plots``);
    a hang fails the test instead of CI."""
    args = without_plots(args)
    if run_dir is not None:
        args = [*args, "--run-dir", str(run_dir)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(extra_env or {})}
    if extra_env and "PYTHONPATH" in extra_env and os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join([extra_env["PYTHONPATH"], os.environ["PYTHONPATH"]])
    try:
        command = mpirun_command(ranks, args, machinefile, mpirun_args)
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun did not finish within {timeout} s:\n{exc.stdout}\n{exc.stderr}")
    return MpiResult(proc.returncode, proc.stdout + proc.stderr, run_dir or ROOT)


def wait_for_rounds(run_dir: Path, count: int, proc: subprocess.Popen) -> None:
    """Until ``proc``'s run has written ``count`` rounds; a job that ends or stalls first fails the test."""
    deadline = time.monotonic() + MPI_TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        path = run_dir / "rounds.csv"
        if path.exists() and len(read_rounds(path)) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"job ended or stalled before {count} rounds: {proc.poll()}\n{proc.communicate()[0]}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under tests/mpirun/ starts real ``mpirun`` jobs: ``-m "not mpirun"`` skips that tier."""
    mpirun_dir = Path(__file__).parent / "mpirun"
    for item in items:
        if mpirun_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.mpirun)


@pytest.fixture
def job_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """What an in-process job logs (its own logger may not propagate to the root)."""
    logger = logging.getLogger("mpi_trainer")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG, logger="mpi_trainer")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture
def tiny_npz(tmp_path: Path) -> Path:
    """A small, learnable 3-class image set in Keras' layout (uint8, 8x8)."""
    rng = np.random.default_rng(0)
    centres = rng.integers(0, 256, size=(3, 8, 8))
    labels = rng.integers(0, 3, size=360)
    images = np.clip(centres[labels] + rng.normal(0, 40, size=(360, 8, 8)), 0, 255).astype(np.uint8)
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=images[:300], y_train=labels[:300], x_test=images[300:], y_test=labels[300:])
    return path
