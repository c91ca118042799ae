"""A LeNet-style keras.Model fitted by mpi_trainer.fit: where it is scored, how often it is combined, as JSON.

    mpirun -n 3 python -m benchmarks.fit_lenet --where scheduler    # rank 0 scores the validation rows
    mpirun -n 3 python -m benchmarks.fit_lenet --where workers      # each of 2 workers scores half
    mpirun -n 3 python -m benchmarks.fit_lenet --overlap            # rank 0 scores while the next epoch trains
    mpirun -n 3 python -m benchmarks.fit_lenet --sync-every 8       # combined every 8 steps, not every epoch
    mpirun -n 3 python -m benchmarks.fit_lenet --sync-every auto    # the steps chosen from the first round
    mpirun -n 3 python -m benchmarks.fit_lenet --outer none         # plain averaging (default: auto)

A LeNet-style CNN (Conv32-Conv32-MaxPool-Conv64-MaxPool-Dense128-Dense10) on 4,000 real MNIST digits
(the ``bench`` extra's copy) for 4 epochs, 2 workers, validated every epoch on 1,000 held-out digits
repeated 4 times (4,000 rows, so that scoring weighs as it does on a real validation split). Rank 0
prints the median of the epochs' ``eval_seconds`` after the first (which traces the test step), the
validation accuracy after every epoch, the final loss, the wall time, and the seconds at the end of
each epoch (from the first epoch's start).
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
    parser.add_argument("--sync-every", type=lambda text: text if text == "auto" else int(text), default=0,
                        help="train.sync_every (0: once an epoch; auto: chosen from the first round, logged)")
    parser.add_argument("--outer", default="auto", help="aggregation.outer_optimizer")
    parser.add_argument("--overlap", action="store_true", help="train.overlap_eval: rank 0 scores each epoch while "
                        "the workers train the next")
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
                              overrides={"evaluation.where": args.where, "train.sync_every": args.sync_every,
                                         "aggregation.outer_optimizer": args.outer,
                                         "train.overlap_eval": args.overlap,
                                         "log.verbosity": 1 if args.sync_every == "auto" else 0})
    if placed.is_scheduler:
        print(json.dumps({"eval_seconds": statistics.median(history.rounds["eval_seconds"][1:]),
                          "val_accuracy": history.history["val_accuracy"][-1],
                          "val_accuracy_by_epoch": history.history["val_accuracy"],
                          "elapsed_by_epoch": list(np.cumsum(history.rounds["wall_seconds"])),
                          "val_loss": history.history["val_loss"][-1],
                          "seconds": time.perf_counter() - started}), flush=True)


if __name__ == "__main__":
    main()
