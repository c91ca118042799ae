"""Full-batch L-BFGS: distributed evaluations against one process computing the same objective, side by side.

One process: the whole training set's loss and gradient in one process with all the node's cores,
SciPy's L-BFGS-B called directly. mpi_trainer: ``mpirun -n W+1`` with the blocks on W workers. Both run
softmax regression (784 -> 10) on a synthetic MNIST-shaped set for the same iterations from the same
start; the figures are median seconds per function evaluation (the scheduler's wall time per iteration
without the test evaluation, over the iteration's evaluations; the median because the machine is
shared and a descheduled process skews a mean), bytes per evaluation
against ``8 W (2P + W + 3)``, and the final loss's relative difference.

    .venv/bin/python scripts/bench_lbfgs.py [--iterations 10] [--samples 72000] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from benchlib import ROOT, run_job, synthetic_images

ONE_PROCESS = r"""
import json, os, sys, time
from mpi_trainer.launch.runtime import configure_threads
configure_threads(os.cpu_count())
import keras
from mpi_trainer.algorithms.lbfgs import LbfgsSettings, minimize
from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
from mpi_trainer.models.gradients import BlockGradient
data = load_dataset(DataConfig(source=sys.argv[1], validation_size=0.0), seed=0)
keras.utils.set_random_seed(0)
model, _ = build_model(ModelConfig(name="softmax_regression", optimizer="lbfgs"), data.input_shape, data.num_outputs)
gradient = BlockGradient(model, batch_size=int(sys.argv[3]))
x, y, n = data.x_train, data.y_train, data.num_train
spent = []
def evaluate(params):
    started = time.perf_counter()
    loss, grad = gradient(params, x, y)
    spent.append(time.perf_counter() - started)
    return loss / n, grad / n
outcome = minimize(evaluate, gradient.vector.read(), LbfgsSettings(int(sys.argv[2])))
spent.sort()
print(json.dumps({"per_evaluation": spent[len(spent) // 2], "loss": outcome.loss,
                  "evaluations": outcome.evaluations, "params": gradient.size}))
"""


def one_process(source: Path, iterations: int, batch: int) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", ONE_PROCESS, str(source), str(iterations), str(batch)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def distributed(source: Path, workers: int, iterations: int, batch: int, run_dir: Path) -> dict:
    summary, rounds = run_job(workers + 1, "configs/mnist_softmax_lbfgs.toml",
                              [f"data.source='{source}'", f"train.epochs={iterations}",
                               f"lbfgs.batch_size={batch}"], run_dir)
    counts = [0] + [int(r["function_evaluations"]) for r in rounds]
    per_iteration = [(float(r["wall_seconds"]) - float(r["eval_seconds"])) / (after - before)
                     for r, before, after in zip(rounds, counts, counts[1:])]
    evaluations = counts[-1]
    return {"per_evaluation": float(np.median(per_iteration)), "loss": float(rounds[-1]["train_loss"]),
            "evaluations": evaluations, "bytes": sum(int(r["bytes"]) for r in rounds) / evaluations}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--samples", type=int, default=72000)
    parser.add_argument("--batch", type=int, default=6000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = synthetic_images(Path(tmp) / "mnist_like.npz", args.samples)
        base = one_process(source, args.iterations, args.batch)
        print(f"one process: {base['per_evaluation'] * 1e3:.1f} ms per evaluation, {base['evaluations']} "
              f"evaluations, final loss {base['loss']:.6g}")
        params = base["params"]
        for workers in args.workers:
            run = distributed(source, workers, args.iterations, args.batch, Path(tmp) / f"w{workers}")
            expected = 8 * workers * (2 * params + workers + 3)
            print(f"W={workers}: {run['per_evaluation'] * 1e3:.1f} ms per evaluation "
                  f"(ratio to one process {run['per_evaluation'] / base['per_evaluation']:.2f}), "
                  f"{run['evaluations']} evaluations, {run['bytes']:.0f} bytes per evaluation "
                  f"(formula {expected}), final loss relative difference "
                  f"{abs(run['loss'] / base['loss'] - 1):.1e}")


if __name__ == "__main__":
    main()
