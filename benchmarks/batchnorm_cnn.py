"""A BatchNormalization CNN in the style of keras.io's convnets: held-out accuracy, one training, as JSON.

    mpirun -n 3 python -m benchmarks.batchnorm_cnn --outer auto --seed 0    # mpi_trainer.fit, 2 workers
    mpirun -n 3 python -m benchmarks.batchnorm_cnn --outer none --seed 0    # ... without the outer step
    python -m benchmarks.batchnorm_cnn --plain --seed 0                      # plain Keras model.fit
    mpirun -n 3 python -m benchmarks.batchnorm_cnn --mnist --epochs 8        # the MNIST task below

The task: scikit-learn's digits as uint8 8x8 images (values 0-255, as image files hold them), 1,400
for training and 397 held out. The model rescales inside (``Rescaling(1/255)``), then two
Conv-BatchNorm-ReLU blocks, dropout and a softmax: the moving statistics are state combined as one
process holds them, never stepped by the outer optimizer. With ``--mnist``: 4,000 real MNIST digits
(28x28 uint8, the ``bench`` extra's copy) for training and 1,000 held out, and a model with random
translation and zoom layers, then two Conv-BatchNorm(momentum 0.99, Keras' default)-ReLU-MaxPool
blocks. mpi_trainer trains at batch 32 per worker, plain Keras at batch 64 (the same global batch
for 2 workers). Rank 0 (or the one process) prints the accuracy.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np


def digits_images() -> tuple[np.ndarray, ...]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.round(digits.images * 255 / 16).astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], digits.target[order]
    return images[:1400], labels[:1400], images[1400:], labels[1400:]


def mnist_images() -> tuple[np.ndarray, ...]:
    from benchmarks.data import mnist5k

    with np.load(mnist5k()) as data:
        return data["x_train"], data["y_train"], data["x_test"], data["y_test"]


def mnist_network(seed: int) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((28, 28)), keras.layers.Rescaling(1 / 255), keras.layers.Reshape((28, 28, 1)),
        keras.layers.RandomTranslation(0.1, 0.1), keras.layers.RandomZoom(0.1),
        keras.layers.Conv2D(16, 3), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.002), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def network(seed: int) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8, 8)), keras.layers.Rescaling(1 / 255), keras.layers.Reshape((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same"), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Conv2D(32, 3, padding="same"), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dropout(0.3),
        keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.002), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outer", choices=["auto", "none", "nesterov"], default="auto")
    parser.add_argument("--plain", action="store_true", help="plain Keras model.fit in this one process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--mnist", action="store_true", help="4,000 real MNIST digits and an augmenting model")
    args = parser.parse_args()
    import mpi_trainer

    placed = mpi_trainer.init(threads=1)  # before Keras is imported: it sizes the thread pools
    x_train, y_train, x_test, y_test = mnist_images() if args.mnist else digits_images()
    model = (mnist_network if args.mnist else network)(args.seed)
    started = time.perf_counter()
    if args.plain:
        model.fit(x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0)
    else:
        mpi_trainer.fit(model, x_train, y_train, batch_size=32, epochs=args.epochs, verbose=0,
                        overrides={"aggregation.outer_optimizer": args.outer, "log.verbosity": 0})
    seconds = time.perf_counter() - started
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    if placed.is_scheduler:
        print(json.dumps({"accuracy": accuracy, "loss": loss, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()
