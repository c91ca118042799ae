"""Scaling with the number of CPU workers, on the Keras backend ``KERAS_BACKEND`` names (JAX for the table).

Every run trains LeNet (484,714 parameters) on the same images, batch 64, Adadelta, one epoch = one
round = every training image once, with the same threads per process, on CPU
(``train.device = cpu``):

* plain Keras: one process calling ``model.fit`` with ``validation_data`` (scored every epoch), at
  those threads and again at every core (what a user would run);
* mpi_trainer with W workers for each ``--workers`` (``mpirun -n W+1``), ``train.threads`` fixed.

For each: training samples/s (epochs after the first, which compiles), seconds per epoch with its
scoring, the speed-up over one worker, the efficiency (samples/s over W times one worker's, at
the same threads per worker: weak scaling) and the wall seconds to the target test accuracy.
The threads per process default to the cores divided by the largest W (the scheduler mostly waits).
It also runs W independent plain processes at once (W = the largest that fits the cores at those
threads): what the cores give any W busy processes, the ceiling of the efficiency on this machine.

    KERAS_BACKEND=jax .venv/bin/python scripts/bench_scaling.py [--data mnist5k | FILE.npz] \
        [--workers 1 2 4 8] [--threads T] [--epochs 6] [--target 0.95]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import BATCH, bench_data
from benchlib import ROOT, run_job

PLAIN = r"""
import json, sys, time
from mpi_trainer.launch.runtime import configure_threads
configure_threads(int(sys.argv[3]))
import keras
from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
epochs, batch = int(sys.argv[2]), int(sys.argv[4])
data = load_dataset(DataConfig(source=sys.argv[1], validation_size=0.0), seed=0)
keras.utils.set_random_seed(0)
model, _ = build_model(ModelConfig(name="lenet", optimizer="adadelta", learning_rate=1.0), data.input_shape,
                       data.num_outputs)
rows, started = [], time.perf_counter()
marks = {}
def begin(epoch, logs):
    marks["begin"] = time.perf_counter()
def end(epoch, logs):
    rows.append({"epoch": epoch, "elapsed": time.perf_counter() - started, "accuracy": logs["val_accuracy"],
                 "seconds": time.perf_counter() - marks["begin"]})
model.fit(data.x_train, data.y_train, batch_size=batch, epochs=epochs, verbose=0,
          validation_data=(data.x_test, data.y_test),
          callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end)])
print(json.dumps({"rows": rows, "samples": len(data.x_train), "backend": keras.backend.backend()}))
"""


def plain(data: Path, epochs: int, threads: int) -> dict:
    return plain_result(plain_process(data, epochs, threads))


def plain_process(data: Path, epochs: int, threads: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PLAIN, str(data), str(epochs), str(threads), str(BATCH)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def plain_result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"plain Keras failed ({proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    rows = result["rows"]
    return {"samples_per_second": result["samples"] * (len(rows) - 1) / sum(r["seconds"] for r in rows[1:]),
            "epoch_seconds": (rows[-1]["elapsed"] - rows[0]["elapsed"]) / (len(rows) - 1),
            "curve": [(r["elapsed"], r["accuracy"]) for r in rows], "backend": result["backend"]}


def trainer(data: Path, workers: int, epochs: int, threads: int, scratch: Path) -> dict:
    overrides = [f"data.source='{data}'", "data.validation_size=0.0", "model.name=lenet", "model.optimizer=adadelta",
                 "model.learning_rate=1.0", f"train.epochs={epochs}", f"train.batch_size={BATCH}",
                 f"train.threads={threads}", "train.device=cpu", "checkpoint.every=0", "log.plots=false",
                 "log.verbosity=0"]
    summary, rounds = run_job(workers + 1, "configs/mnist_lenet.toml", overrides, scratch / f"w{workers}")
    steady = rounds[1:]  # round 0 compiles
    return {"samples_per_second": sum(int(r["samples"]) for r in steady)
            / sum(float(r["train_seconds_max"]) for r in steady),
            "epoch_seconds": (float(rounds[-1]["elapsed_seconds"]) - float(rounds[0]["elapsed_seconds"]))
            / (len(rounds) - 1),
            "curve": [(float(r["elapsed_seconds"]), float(r["test_accuracy"])) for r in rounds],
            "backend": summary["placement"][1]["backend"]}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((elapsed for elapsed, accuracy in curve if accuracy >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="mnist5k", help="mnist5k, or a Keras-layout .npz")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--threads", type=int, default=0, help="threads per process (0: cores / largest W)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--target", type=float, default=0.95)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores // max(args.workers))
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_data(args.data, Path(tmp))
        results = {f"plain Keras fit, {threads} thread(s)": plain(data, args.epochs, threads)}
        if threads != cores:
            results[f"plain Keras fit, all {cores} cores"] = plain(data, args.epochs, cores)
        for workers in sorted(set(args.workers)):
            results[f"mpi_trainer, {workers} worker(s)"] = trainer(data, workers, args.epochs, threads, Path(tmp))
        alone = results[f"plain Keras fit, {threads} thread(s)"]["samples_per_second"]
        together = max([w for w in args.workers if w > 1 and w * threads <= cores], default=0)
        if together:
            procs = [plain_process(data, args.epochs, threads) for _ in range(together)]
            shared = sum(plain_result(p)["samples_per_second"] for p in procs)
    backends = {r["backend"] for r in results.values()}
    print(f"backend {', '.join(sorted(backends))}; LeNet, batch {BATCH}, {args.epochs} epochs/rounds; {cores} cores; "
          f"{threads} thread(s) per process; target test accuracy {args.target}")
    print("| run | samples/s (train) | s per epoch + scoring | speed-up | efficiency | s to target |")
    print("|---|---|---|---|---|---|")
    one = results.get("mpi_trainer, 1 worker(s)")
    for name, result in results.items():
        workers = int(name.split(", ")[1].split()[0]) if name.startswith("mpi_trainer") else None
        speedup = efficiency = ""
        if one is not None and workers is not None:
            ratio = result["samples_per_second"] / one["samples_per_second"]
            speedup, efficiency = f"{ratio:.2f}", f"{ratio / workers:.2f}"
        reached = time_to(result["curve"], args.target)
        print(f"| {name} | {result['samples_per_second']:.0f} | {result['epoch_seconds']:.2f} | {speedup} | "
              f"{efficiency} | {'not reached' if reached is None else f'{reached:.1f}'} |")
    if together:
        print(f"{together} independent plain Keras processes at {threads} thread(s) each, at the same time: "
              f"{shared:.0f} samples/s against {together} x {alone:.0f} alone = {shared / (together * alone):.2f}, "
              f"the ceiling of a {together}-process efficiency on these cores")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
