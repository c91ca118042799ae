"""How fast does a job notice a dead or a silent worker?"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import QUICKSTART, train_command
from mpi_trainer.launch.mpirun import rank_pid

QUESTION = "Faults: a dead or silent worker"
# watchdog.worker_timeout for the silent worker: above the first round (which compiles the model)
# even on a busy machine, or the watchdog would end the job before the worker is stopped.
TIMEOUT = 30.0


def wait_for_rounds(proc: subprocess.Popen, run_dir: Path, count: int, limit: float = 600.0) -> None:
    """Until rounds.csv holds ``count`` rows (a header line first); fails if the job ends before."""
    deadline = time.monotonic() + limit
    path = run_dir / "rounds.csv"
    while not (path.exists() and len(path.read_text().splitlines()) > count):
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended (exit {proc.returncode}) before round {count - 1} was written")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {count} rounds in {run_dir} within {limit} s")
        time.sleep(0.05)


def seconds_to_exit(sig: int, overrides: list[str]) -> Figures:
    """Signal worker rank 2 once two rounds are written; seconds until mpirun has exited."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        command = train_command(3, QUICKSTART, ["train.epochs=200", *overrides], run_dir)
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_rounds(proc, run_dir, 2)
            pid = rank_pid(proc.pid, 2)
            if pid is None:
                raise RuntimeError("worker rank 2 not found under mpirun")
            os.kill(pid, sig)
            signalled = time.perf_counter()
            code = proc.wait(timeout=120)
            return {"seconds": time.perf_counter() - signalled, "exit_code": float(code)}
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def comparisons(quick: bool) -> list[Comparison]:
    return [Comparison(
        title="MLP on digits, 2 workers; worker rank 2 killed or stopped after round 1",
        command=f"python -m benchmarks run faults{' --quick' if quick else ''}",
        variants={"`kill -9`, no watchdog": lambda: seconds_to_exit(signal.SIGKILL, []),
                  f"`SIGSTOP`, `watchdog.worker_timeout = {TIMEOUT:g}`":
                      lambda: seconds_to_exit(signal.SIGSTOP, [f"watchdog.worker_timeout={TIMEOUT}"])},
        columns={"seconds": "s from the signal to the job's end", "exit_code": "exit code"},
        notes="A dead rank needs no watchdog (Open MPI sees the process exit); a silent one ends after "
              "the timeout, counted from the round's start.")]
