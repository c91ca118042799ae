"""Time lost to one lost worker: surviving it in the job (``fault.survive``) against a restart by ``launch``.

Four runs of the same job, each through ``python -m mpi_trainer launch -n N``:

* ``default``: undisturbed, Open MPI's default transport;
* ``ft``: undisturbed, ``fault.survive = true`` (launch adds the fault-tolerant MPI options);
* ``ft+kill``: as ``ft``, and worker rank ``--rank`` gets SIGKILL once ``--kill-round`` rounds are
  in rounds.csv (so in round ``--kill-round``): the survivors shrink and carry on;
* ``default+kill``: as ``default`` with the same kill: the job dies and ``launch`` restarts it with
  ``--resume`` from the last checkpoint (``checkpoint.every = 1``: the least a restart can lose).

The script watches rounds.csv and notes when each round's row appears. A round's interval is the
time from the previous row to its own; the time a failure costs is the killed round's interval
minus the same round's interval in the undisturbed run on the same transport. It also prints the
median interval of the undisturbed rounds after the first (what the fault-tolerant transport costs
per round when nothing fails) and each run's wall time.

    .venv/bin/python scripts/bench_survive.py                      # digits, MLP, 3 workers, 10 rounds
    .venv/bin/python scripts/bench_survive.py --config configs/mnist_lenet.toml --set data.source=PATH
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpi_trainer.launch.mpirun import rank_pid  # noqa: E402
from mpi_trainer.persistence.run_files import read_rounds  # noqa: E402

RUNS = {"default": (False, False), "ft": (True, False), "ft+kill": (True, True), "default+kill": (False, True)}


def row_count(path: Path) -> int:
    try:
        return len(read_rounds(path))
    except (OSError, ValueError):
        return 0


def run(name: str, args: argparse.Namespace, work: Path) -> dict:
    """One launch; returns the wall time and the time each round's row appeared (relative to the start)."""
    survive, kill = RUNS[name]
    run_dir = work / name.replace("+", "_")
    sets = ["--set", f"train.epochs={args.rounds}", "--set", "checkpoint.every=1", "--set", "log.plots=false",
            "--set", f"fault.survive={'true' if survive else 'false'}", *[x for s in args.set for x in ("--set", s)]]
    command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", str(args.ranks), "--max-restarts", "2",
               args.config, *sets, "--run-dir", str(run_dir)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.monotonic()
    launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    seen, times, killed = 0, [], not kill
    while launcher.poll() is None:
        count = row_count(run_dir / "rounds.csv")
        if count > seen:
            times += [time.monotonic() - started] * (count - seen)
            seen = count
        if not killed and seen >= args.kill_round:
            pid = rank_pid(launcher.pid, args.rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = True
        time.sleep(0.02)
    count = row_count(run_dir / "rounds.csv")
    times += [time.monotonic() - started] * (count - seen)
    if launcher.returncode != 0 or count != args.rounds:
        raise SystemExit(f"{name}: launch exited {launcher.returncode} with {count} rounds; see {run_dir}")
    workers = [int(row["workers"]) for row in read_rounds(run_dir / "rounds.csv")]
    return {"wall": time.monotonic() - started, "times": times, "workers": workers}


def intervals(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


def report(results: dict[str, dict], kill_round: int) -> None:
    print("| run | wall s | round intervals s (from round 1) | median interval s | workers per round |")
    print("|---|---|---|---|---|")
    for name, result in results.items():
        gaps = intervals(result["times"])
        print(f"| {name} | {result['wall']:.1f} | {' '.join(f'{g:.2f}' for g in gaps)} | "
              f"{statistics.median(gaps):.2f} | {' '.join(map(str, result['workers']))} |")
    for killed, calm in (("ft+kill", "ft"), ("default+kill", "default")):
        if killed in results and calm in results:
            gap = kill_round - 1  # the interval that ends with the killed round's row
            lost = intervals(results[killed]["times"])[gap] - intervals(results[calm]["times"])[gap]
            print(f"{killed}: round {kill_round} took {lost:.2f} s longer than undisturbed; the whole run "
                  f"{results[killed]['wall'] - results[calm]['wall']:+.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--ranks", type=int, default=4, help="mpirun -n (rank 0 schedules)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--kill-round", type=int, default=3)
    parser.add_argument("--rank", type=int, default=2, help="the worker rank killed")
    parser.add_argument("--runs", nargs="+", choices=sorted(RUNS), default=list(RUNS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        results = {name: run(name, args, Path(work)) for name in args.runs}
    report(results, args.kill_round)


if __name__ == "__main__":
    main()
