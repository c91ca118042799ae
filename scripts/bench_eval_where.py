#!/usr/bin/env python3
"""Who scores the global model: the scheduler alone, or the workers on their shards (``evaluation.where``).

Runs the same LeNet job (2 workers, ``mpirun -n 3``) with ``evaluation.where = "scheduler"`` and
``"workers"``, alternating, ``--repeats`` times each, and prints per mode the mean round wall time
and evaluation time (rounds after the first, which compiles), the bytes per round and the wall time
to ``--target`` test accuracy, with the workers' figures as ratios of the scheduler's.

Data: ``--data mnist5k`` (5,000 real MNIST digits), a Keras-layout ``.npz``, else scikit-learn's
digits upsampled to 28x28.

    .venv/bin/python scripts/bench_eval_where.py [--data mnist5k | mnist.npz] [--epochs 6] [--repeats 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench import BATCH, bench_data
from benchlib import run_job

MODES = ("scheduler", "workers")


def one_run(data: Path, where: str, epochs: int, run_dir: Path) -> dict[str, float]:
    overrides = [f"data.source={data}", "data.validation_size=0.0", "model.name=lenet", "model.optimizer=adadelta",
                 "model.learning_rate=1.0", f"train.epochs={epochs}", f"train.batch_size={BATCH}",
                 "checkpoint.every=0", "log.verbosity=0", f"evaluation.where={where}"]
    _, rounds = run_job(3, "configs/mnist_lenet.toml", overrides, run_dir)
    steady = rounds[1:]
    return {"wall": statistics.mean(float(r["wall_seconds"]) for r in steady),
            "eval": statistics.mean(float(r["eval_seconds"]) for r in steady),
            "bytes": statistics.mean(int(r["bytes"]) for r in steady),
            "accuracy": [float(r["test_accuracy"]) for r in rounds],
            "elapsed": [float(r["elapsed_seconds"]) for r in rounds]}


def time_to(run: dict, target: float) -> float:
    return next((t for t, a in zip(run["elapsed"], run["accuracy"]) if a >= target), float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="mnist5k, or a Keras-layout .npz (default: digits upsampled to 28x28)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.95)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mpi_trainer_eval_where_"))
    data = bench_data(args.data, scratch)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode in MODES:  # alternating, so that a slow spell of the machine hits both
            runs[mode].append(one_run(data, mode, args.epochs, scratch / f"{mode}{repeat}"))
    print(f"data: {data}; 2 workers; mean of {args.repeats} runs each, rounds after the first\n")
    print("| evaluation.where | round wall s | evaluation s | bytes per round | s to target | ratio of wall |")
    print("|---|---|---|---|---|---|")
    base = statistics.mean(r["wall"] for r in runs["scheduler"])
    for mode in MODES:
        wall = statistics.mean(r["wall"] for r in runs[mode])
        print(f"| {mode} | {wall:.3f} | {statistics.mean(r['eval'] for r in runs[mode]):.3f} | "
              f"{statistics.mean(r['bytes'] for r in runs[mode]):,.0f} | "
              f"{statistics.mean(time_to(r, args.target) for r in runs[mode]):.1f} | {wall / base:.3f} |")


if __name__ == "__main__":
    main()
