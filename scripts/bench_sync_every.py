"""Per-step rounds (``train.sync_every = 1``) against plain Keras ``train_on_batch``, on the same threads.

Plain Keras: one process sized like the worker (``configure_threads`` with the node's cores)
calls ``model.train_on_batch`` in a loop on random batches of the training images.
mpi_trainer: ``mpirun -n 2`` (scheduler + one worker) with ``train.sync_every = 1``: every
round broadcasts the weights, runs one step, reports, reduces and records the round. Its
per-step time is the time between the ends of consecutive rounds (``elapsed_seconds`` in
rounds.csv), after warm-up and before the last round (which is always evaluated); the
worker's own ``train_on_batch`` time per round (``train_seconds_max``) splits it into the step
and what the round adds. It runs three ways: tuned for k = 1 (scoring only the last round,
``train.overlap_eval``, 1 ms polls), with the defaults (scoring once per local epoch) and scoring
every round (``evaluation.every = 1``). All use
LeNet (484,714 parameters) on scikit-learn's digits upsampled to 28x28, or ``--data mnist5k``
(5,000 real MNIST digits) or a Keras-layout ``.npz``; plain and mpi_trainer runs alternate
``--repeats`` times, and medians are printed.

    .venv/bin/python scripts/bench_sync_every.py [--data mnist5k] [--steps 40] [--batch-size 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import bench_data
from benchlib import ROOT, run_job

WARMUP = 5

PLAIN = r"""
import json, os, sys, time
from mpi_trainer.launch.runtime import configure_threads
configure_threads(os.cpu_count())
import keras
import numpy as np
from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
steps, batch, warmup = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = load_dataset(DataConfig(source=sys.argv[1], validation_size=0.0), seed=0)
keras.utils.set_random_seed(0)
model, _ = build_model(ModelConfig(name="lenet"), data.input_shape, data.num_outputs)
rng = np.random.default_rng(0)
x, y = data.x_train, data.y_train
for step in range(warmup + steps):
    if step == warmup:
        started = time.perf_counter()
    rows = rng.choice(len(x), batch, replace=False)
    model.train_on_batch(x[rows], y[rows], return_dict=True)
print(json.dumps({"step_seconds": (time.perf_counter() - started) / steps, "parameters": model.count_params()}))
"""


def plain_step(data: Path, steps: int, batch: int) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(data), str(steps), str(batch), str(WARMUP)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["parameters"] == 484_714, result
    return result["step_seconds"]


def mpi_step(data: Path, steps: int, batch: int, settings: list[str], run_dir: Path) -> dict[str, float]:
    """Medians over the timed one-step rounds: the interval between round ends, the worker's own
    train_on_batch time in it, what the round adds around that step, and the evaluation."""
    rounds = WARMUP + steps + 1
    overrides = [f"data.source='{data}'", "data.validation_size=0.0", "model.name=lenet",
                 f"train.epochs={rounds}", f"train.batch_size={batch}", "train.sync_every=1",
                 "checkpoint.every=0", "log.plots=false", *settings]
    summary, rows = run_job(2, "configs/quickstart.toml", overrides, run_dir)
    assert summary["steps"] == rounds, summary["steps"]
    timed = list(zip(rows[WARMUP - 1:-2], rows[WARMUP:-1]))  # the last round is always evaluated
    interval = [float(b["elapsed_seconds"]) - float(a["elapsed_seconds"]) for a, b in timed]
    train = [float(b["train_seconds_max"]) for _, b in timed]
    return {"step": statistics.mean(interval), "train": statistics.median(train),
            "overhead": statistics.median(i - t for i, t in zip(interval, train)),
            "eval": statistics.median(float(b["eval_seconds"]) for _, b in timed)}


# At k = 1 a round is one step: score only at the end, record while the next round trains, and
# poll for peers at 1 ms rather than the default 5 ms. The second variant keeps the defaults (scoring
# once per local epoch); the third scores every round, the default before evaluation.every = 0.
TUNED = ["evaluation.every=1000000", "train.overlap_eval=true", "comm.poll_interval=0.001"]
VARIANTS = {"tuned": TUNED, "defaults": [], "every round": ["evaluation.every=1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", help="mnist5k, or a Keras-layout .npz (default: digits upsampled to 28x28)")
    args = parser.parse_args()
    plain: list[float] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_data(args.data, Path(tmp))
        for repeat in range(args.repeats):
            plain.append(plain_step(data, args.steps, args.batch_size))
            for name, settings in VARIANTS.items():
                run_dir = Path(tmp) / f"{name.replace(' ', '_')}{repeat}"
                runs[name].append(mpi_step(data, args.steps, args.batch_size, settings, run_dir))
    report(args, plain, runs)


def report(args: argparse.Namespace, plain: list[float], runs: dict[str, list[dict[str, float]]]) -> None:
    base = statistics.median(plain)
    print(f"LeNet (484,714 parameters), batch {args.batch_size}, {args.steps} timed steps, {os.cpu_count()} cores, "
          f"medians of {args.repeats} alternating runs")
    print(f"{'':<44} {'ms/step':>8} {'ratio':>6} {'worker step':>12} {'added':>7} {'eval':>6}")
    print(f"{'plain Keras train_on_batch loop':<44} {1000 * base:>8.1f} {1.0:>6.3f}")
    labels = {"tuned": "mpi_trainer k=1, scored at end, overlap",
              "defaults": "mpi_trainer k=1, defaults (scored each epoch)",
              "every round": "mpi_trainer k=1, scored every round"}
    for name, results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(f"{labels[name]:<44} {1000 * median['step']:>8.1f} {median['step'] / base:>6.3f} "
              f"{1000 * median['train']:>12.1f} {1000 * median['overhead']:>7.1f} {1000 * median['eval']:>6.1f}")
    print("(ms; 'worker step': the worker's train_on_batch inside the round; 'added': the round's time around it)")
    print("plain runs, ms/step:", ", ".join(f"{1000 * s:.1f}" for s in plain))
    for name, results in runs.items():
        print(f"{name} runs, ms/step:", ", ".join(f"{1000 * r['step']:.1f}" for r in results))


if __name__ == "__main__":
    main()
