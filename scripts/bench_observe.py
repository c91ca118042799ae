"""What seeing a run costs: the same job with TensorBoard, timeline and end-of-run plots on and off.

Runs the job alternately with everything on (``log.tensorboard``, ``log.timeline``, ``log.plots``)
and everything off, side by side, and prints the mean training time (summary.json
``wall_seconds``, the rounds only), the whole command's time (start-up and the end-of-run report
included) and their on/off ratios; then the time ``mpi_trainer report`` takes on the last run.

    .venv/bin/python scripts/bench_observe.py [--rounds 10] [--repeats 2] [--ranks 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchlib import run_job

from mpi_trainer.reporting.report import make_report

MODES = {"off": ["log.tensorboard=false", "log.timeline=false", "log.plots=false"],
         "on": ["log.tensorboard=true", "log.timeline=true", "log.plots=true"]}


def measure(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, list[float]]]:
    results = {mode: {"train": [], "command": []} for mode in MODES}
    for repeat in range(args.repeats):
        for mode, overrides in MODES.items():
            started = time.perf_counter()
            summary, _ = run_job(args.ranks, "configs/quickstart.toml",
                                 [f"train.epochs={args.rounds}", "checkpoint.every=0", *overrides],
                                 tmp / f"{mode}-{repeat}")
            results[mode]["command"].append(time.perf_counter() - started)
            results[mode]["train"].append(summary["wall_seconds"])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(args, Path(tmp))
        started = time.perf_counter()
        make_report(Path(tmp) / f"on-{args.repeats - 1}")
        report_seconds = time.perf_counter() - started
    mean = {mode: {k: statistics.mean(v) for k, v in r.items()} for mode, r in results.items()}
    print(f"{'mode':<5} {'train s (mean)':>15} {'command s (mean)':>17}")
    for mode, m in mean.items():
        print(f"{mode:<5} {m['train']:>15.2f} {m['command']:>17.2f}")
    print(f"on / off: training time {mean['on']['train'] / mean['off']['train']:.3f}, "
          f"whole command {mean['on']['command'] / mean['off']['command']:.3f}")
    print(f"mpi_trainer report on a {args.rounds}-round run (in-process, 4 PNGs + report.txt): "
          f"{report_seconds:.2f} s")


if __name__ == "__main__":
    main()
