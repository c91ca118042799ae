"""One worker under mpirun vs plain Keras on the same cores, side by side.

Plain Keras: ``model.fit(epochs=E, validation_data=test)`` in one process with the node's cores.
mpi_trainer: ``mpirun -n 2`` (scheduler + one worker) for E rounds; each round broadcasts the
weights, trains one epoch, reduces, and evaluates on the test split. Both use the LeNet on a
synthetic MNIST-shaped set; the ratio compares the time of the E epochs / rounds only (set-up excluded).

    .venv/bin/python scripts/bench_single_worker.py [--epochs 3] [--samples 6000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import ROOT, run_job, synthetic_images

PLAIN = r"""
import json, os, sys, time
from mpi_trainer.launch.runtime import configure_threads
configure_threads(os.cpu_count())
import keras
from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
epochs, batch = int(sys.argv[2]), int(sys.argv[3])
data = load_dataset(DataConfig(source=sys.argv[1], validation_size=0.0), seed=0)
keras.utils.set_random_seed(0)
model, _ = build_model(ModelConfig(name="lenet"), data.input_shape, data.num_outputs)
started = time.perf_counter()
history = model.fit(data.x_train, data.y_train, batch_size=batch, epochs=epochs, verbose=0,
                    validation_data=(data.x_test, data.y_test), validation_batch_size=max(256, batch))
print(json.dumps({"seconds": time.perf_counter() - started, "accuracy": history.history["val_accuracy"][-1]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = synthetic_images(Path(tmp) / "images.npz", args.samples)
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        plain = json.loads(subprocess.run(
            [sys.executable, "-c", PLAIN, str(data), str(args.epochs), str(args.batch_size)],
            cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
        summary, rounds = run_job(2, "configs/quickstart.toml",
                                  [f"data.source='{data}'", "data.validation_size=0.0", "model.name=lenet",
                                   f"train.epochs={args.epochs}", f"train.batch_size={args.batch_size}"],
                                  Path(tmp) / "run")
    mpi_seconds = sum(float(r["wall_seconds"]) for r in rounds)
    print(f"{'':<28} {'seconds':>8} {'test acc':>9}")
    print(f"{'plain Keras fit':<28} {plain['seconds']:>8.2f} {plain['accuracy']:>9.4f}")
    print(f"{'mpi_trainer, 1 worker':<28} {mpi_seconds:>8.2f} {summary['final_test_accuracy']:>9.4f}")
    print(f"mpi_trainer / plain Keras time ratio: {mpi_seconds / plain['seconds']:.3f} "
          f"({os.cpu_count()} cores, {args.epochs} epochs, {args.samples} samples)")


if __name__ == "__main__":
    main()
