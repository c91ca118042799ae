"""What does a lost worker cost with ``fault.survive``, against a restart, and what does the setting cost?"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.data import mnist5k
from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import MNIST_LENET, QUICKSTART, after_first, run_job
from mpi_trainer.launch.mpirun import rank_pid
from mpi_trainer.persistence.run_files import read_rounds

QUESTION = "Surviving a lost worker: fault.survive against a restart by launch"
RANKS = 4  # 3 workers
KILL_ROUND = 3
KILLED_RANK = 2
TRANSPORTS = (("default transport", False), ("fault-tolerant transport", True))


def row_count(path: Path) -> int:
    try:
        return len(read_rounds(path))
    except (OSError, ValueError):
        return 0


def watch(launcher: subprocess.Popen, run_dir: Path) -> list[float]:
    """When each round's row appeared in rounds.csv (seconds since now); SIGKILL to worker rank
    ``KILLED_RANK`` once ``KILL_ROUND`` rows are there, so it dies early in round ``KILL_ROUND``."""
    started, times, killed = time.monotonic(), [], False
    while launcher.poll() is None:
        count = row_count(run_dir / "rounds.csv")
        times += [time.monotonic() - started] * max(0, count - len(times))
        if not killed and len(times) >= KILL_ROUND and (pid := rank_pid(launcher.pid, KILLED_RANK)) is not None:
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.02)
    count = row_count(run_dir / "rounds.csv")
    return times + [time.monotonic() - started] * max(0, count - len(times))


def killed_run(survive: bool, rounds: int, lenet: bool = False) -> Figures:
    """``launch`` of the quick start (``lenet``: LeNet on 5,000 real MNIST digits) with a worker killed
    in round ``KILL_ROUND``.

    ``lost``: the killed round's interval (from the previous round's row to its own) minus the
    median interval of the rounds before it, i.e. what the failure added to the run.
    """
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        sets = [f"train.epochs={rounds}", "checkpoint.every=1", "log.plots=false",
                f"fault.survive={str(survive).lower()}"]
        sets += [f"data.source={mnist5k()}"] if lenet else []
        config = MNIST_LENET if lenet else QUICKSTART
        command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", str(RANKS), "--max-restarts", "2", config,
                   *[x for item in sets for x in ("--set", item)], "--run-dir", str(run_dir)]
        started = time.perf_counter()
        launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times = watch(launcher, run_dir)
        wall = time.perf_counter() - started
        if launcher.returncode != 0 or len(times) != rounds:
            raise RuntimeError(f"launch exited {launcher.returncode} after {len(times)} of {rounds} rounds")
        workers = [int(row["workers"]) for row in read_rounds(run_dir / "rounds.csv")]
    gaps = [later - earlier for earlier, later in zip(times, times[1:])]
    normal = statistics.median(gaps[:KILL_ROUND - 1])  # rounds 1 .. KILL_ROUND - 1 (round 0 traces graphs)
    return {"lost": gaps[KILL_ROUND - 1] - normal, "normal": normal, "wall": wall, "workers_after": workers[-1]}


def round_cost(fault_tolerant: bool, model: str, rounds: int) -> Figures:
    """Per-round seconds with nothing failing, on Open MPI's default transport or the fault-tolerant one."""
    overrides = [f"model.name={model}", f"train.epochs={rounds}", "log.plots=false",
                 f"fault.survive={str(fault_tolerant).lower()}"]
    summary, rows, _ = run_job(RANKS, overrides, fault_tolerant=fault_tolerant)
    return {"round": statistics.median(after_first(rows, "wall_seconds")),
            "comm": statistics.median(after_first(rows, "comm_seconds")),
            "mib": summary["model_bytes"] / 2**20}


def comparisons(quick: bool) -> list[Comparison]:
    rounds = 6 if quick else 10
    flag = " --quick" if quick else ""
    command = f"python -m benchmarks run survive{flag}"
    return [
        Comparison(title=f"Worker rank {KILLED_RANK} killed (SIGKILL) in round {KILL_ROUND}: LeNet on 5,000 real MNIST "
                         f"digits (4,000 train), {RANKS - 1} workers, {rounds} rounds, `checkpoint.every = 1`, through "
                         f"`launch`",
                   command=command,
                   variants={"`fault.survive = true`: the job shrinks and redoes the round":
                                 lambda: killed_run(True, rounds, lenet=True),
                             "default: the job dies, `launch` restarts it with `--resume`":
                                 lambda: killed_run(False, rounds, lenet=True)},
                   columns={"lost": "s the failure added", "normal": "s per round before it",
                            "wall": "s for the whole launch", "workers_after": "workers at the end"},
                   notes="The target: surviving costs at most one round + 5 s, and under half of a restart."),
        Comparison(title=f"Worker rank {KILLED_RANK} killed (SIGKILL) in round {KILL_ROUND}: MLP on digits, "
                         f"{RANKS - 1} workers, {rounds} rounds, `checkpoint.every = 1`, through `launch`",
                   command=command,
                   variants={"`fault.survive = true`: the job shrinks and redoes the round":
                                 lambda: killed_run(True, rounds),
                             "default: the job dies, `launch` restarts it with `--resume`":
                                 lambda: killed_run(False, rounds)},
                   columns={"lost": "s the failure added", "normal": "s per round before it",
                            "wall": "s for the whole launch", "workers_after": "workers at the end"},
                   notes="The restart resumes from the checkpoint of the round before the kill (the least a "
                         "restart can lose); its cost is every rank's second start-up."),
        Comparison(title=f"Per round with nothing failing: Open MPI's default transport against the fault-tolerant "
                         f"one (`--with-ft ulfm`, ob1 over TCP), {RANKS - 1} workers, {rounds} rounds",
                   command=command,
                   variants={f"{model}, {name}": (lambda model=model, ft=ft: round_cost(ft, model, rounds))
                             for model in ("mlp", "lenet") for name, ft in TRANSPORTS},
                   columns={"round": "s per round (median from round 1)", "comm": "communication s per round",
                            "mib": "MiB per model copy"}),
    ]
