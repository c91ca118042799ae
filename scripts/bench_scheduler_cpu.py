"""How much CPU the scheduler burns while the workers train: polling waits vs blocking MPI waits.

Runs the same job twice, side by side, and prints the scheduler's CPU use during its waits as a
fraction of one core (process CPU time / wall time spent waiting), plus the job's wall time.

    .venv/bin/python scripts/bench_scheduler_cpu.py [--rounds 6] [--ranks 3] [--set aggregation.ssp=1]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchlib import run_job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--model", default="lenet")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more config overrides for both runs, e.g. aggregation.ssp=1")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode, interval in (("polling (default)", 0.005), ("blocking MPI waits", 0.0)):
            summary, rounds = run_job(args.ranks, "configs/quickstart.toml",
                                      [f"model.name={args.model}", f"train.epochs={args.rounds}",
                                       f"comm.poll_interval={interval}", *args.set], Path(tmp) / mode.split()[0])
            results[mode] = summary
    print(f"{'scheduler wait mode':<22} {'wait s':>8} {'wait CPU s':>11} {'CPU/core':>9} {'job wall s':>11}")
    for mode, s in results.items():
        print(f"{mode:<22} {s['scheduler_wait_seconds']:>8.2f} {s['scheduler_wait_cpu_seconds']:>11.2f} "
              f"{s['scheduler_wait_cpu_fraction']:>9.1%} {s['wall_seconds']:>11.2f}")
    polling, blocking = results.values()
    print(f"polling / blocking scheduler CPU while waiting: "
          f"{polling['scheduler_wait_cpu_fraction'] / blocking['scheduler_wait_cpu_fraction']:.3f}; "
          f"job wall time ratio: {polling['wall_seconds'] / blocking['wall_seconds']:.3f}")


if __name__ == "__main__":
    main()
