"""One worker of ``tf.distribute.MultiWorkerMirroredStrategy``, the baseline of the accuracy suite.

    TF_USE_LEGACY_KERAS=1 TF_CONFIG=... python -m benchmarks.mwms DATA.npz [--epochs 8] [--batch 64]
        [--optimizer adadelta|sgd|adam] [--learning-rate 1.0] [--seed 0] [--model lenet|mlp]

The strategy runs only under ``tf_keras`` (Keras 3 does not support it), so the model (LeNet or the
two-hidden-layer perceptron) is written layer for layer as mpi_trainer's zoo builds it. Every process
trains ``--batch`` samples a step (the global batch is that times the workers, as each mpi_trainer
worker takes its own batch), is scored on the test split after every epoch, and the chief prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np


def lenet(tf_keras: Any) -> Any:
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


def mlp(tf_keras: Any) -> Any:
    layers = tf_keras.layers
    return tf_keras.Sequential([
        layers.Input((28, 28, 1)), layers.Flatten(),
        layers.Dense(128, activation="relu"), layers.Dense(64, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ])


def load(path: str) -> tuple[np.ndarray, ...]:
    with np.load(path) as data:
        x_train, y_train, x_test, y_test = (data[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    scale = (lambda a: a.reshape(-1, 28, 28, 1).astype("float32") / 255.0)  # noqa: E731
    return scale(x_train), y_train.astype("int32"), scale(x_test), y_test.astype("int32")


def train(args: argparse.Namespace) -> dict[str, Any] | None:
    import tensorflow as tf
    import tf_keras

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y, x_test, y_test = load(args.data)
    tf_keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = {"lenet": lenet, "mlp": mlp}[args.model](tf_keras)
        chosen = {"adadelta": tf_keras.optimizers.Adadelta, "sgd": tf_keras.optimizers.SGD,
                  "adam": tf_keras.optimizers.Adam}[args.optimizer]
        model.compile(chosen(args.learning_rate), "sparse_categorical_crossentropy", ["accuracy"])
    feed = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed)
            .batch(args.batch * strategy.num_replicas_in_sync).prefetch(1))
    rows, started = [], time.perf_counter()
    for _ in range(args.epochs):
        begun = time.perf_counter()
        model.fit(feed, epochs=1, verbose=0)
        trained = time.perf_counter() - begun
        accuracy = float(model.evaluate(x_test, y_test, batch_size=256, verbose=0)[1])
        rows.append({"train": trained, "elapsed": time.perf_counter() - started, "accuracy": accuracy})
    if json.loads(os.environ["TF_CONFIG"])["task"]["index"] != 0:
        return None
    steady = rows[1:] or rows  # the first epoch traces the graphs
    epoch = (rows[-1]["elapsed"] - rows[0]["elapsed"]) / max(1, len(rows) - 1)
    return {"samples_per_second": len(x) * len(steady) / sum(r["train"] for r in steady),
            "seconds_per_epoch": epoch, "final_test_accuracy": rows[-1]["accuracy"],
            "best_test_accuracy": max(r["accuracy"] for r in rows),
            "curve": [(r["elapsed"], r["accuracy"]) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--optimizer", choices=["adadelta", "sgd", "adam"], default="adadelta")
    parser.add_argument("--learning-rate", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", choices=["lenet", "mlp"], default="lenet")
    result = train(parser.parse_args())
    if result is not None:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
