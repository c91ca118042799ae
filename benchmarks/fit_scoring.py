"""Where a fit scores its validation data: on rank 0 alone, or by the workers in shares, as JSON.

    mpirun -n 3 python -m benchmarks.fit_scoring --where scheduler    # rank 0 scores the validation rows
    mpirun -n 3 python -m benchmarks.fit_scoring --where workers      # each of 2 workers scores half

A LeNet-style CNN (Conv32-Conv32-MaxPool-Conv64-MaxPool-Dense128-Dense10) on 4,000 real MNIST digits
(the ``bench`` extra's copy) for 4 epochs, 2 workers, validated every epoch on 1,000 held-out digits
repeated 4 times (4,000 rows, so that scoring weighs as it does on a real validation split). Rank 0
prints the median of the epochs' ``eval_seconds`` after the first (which traces the test step), the
final validation accuracy and loss, and the wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--where", choices=["scheduler", "workers"], default="scheduler")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    import mpi_trainer

    placed = mpi_trainer.init()
    import keras

    from benchmarks.data import mnist5k

    with np.load(mnist5k()) as data:
        x_train, y_train = data["x_train"] / 255.0, data["y_train"]
        x_val, y_val = np.tile(data["x_test"] / 255.0, (4, 1, 1)), np.tile(data["y_test"], 4)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((28, 28)), keras.layers.Reshape((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10, "softmax")])
    model.compile(keras.optimizers.Adam(0.001), "sparse_categorical_crossentropy", metrics=["accuracy"])
    started = time.perf_counter()
    history = mpi_trainer.fit(model, x_train, y_train, batch_size=64, epochs=args.epochs, verbose=0,
                              validation_data=(x_val, y_val), validation_batch_size=256,
                              overrides={"evaluation.where": args.where, "log.verbosity": 0})
    if placed.is_scheduler:
        print(json.dumps({"eval_seconds": statistics.median(history.rounds["eval_seconds"][1:]),
                          "val_accuracy": history.history["val_accuracy"][-1],
                          "val_loss": history.history["val_loss"][-1],
                          "seconds": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    main()
