"""A Keras script's fit under ``mpirun -n 3``, run twice on one run directory by the tests.

``interrupted``: rank 0 ends its process hard after epoch 2 (checkpointed every epoch), as a killed job
does. ``again``: the same script run again finds its run and resumes it, then a second ``fit`` with a
recompiled model (transfer learning's second phase) on the same directory, which is refused.
Each rank prints one JSON line: its History, its model's score and what the second fit raised.
"""

from __future__ import annotations

import json
import os
import sys

import mpi_trainer

placed = mpi_trainer.init()

import keras  # noqa: E402 - after init, which places this rank before Keras starts
from sklearn.datasets import load_digits  # noqa: E402

from mpi_trainer.errors import InputError  # noqa: E402


class EndAfter(keras.callbacks.Callback):
    """Rank 0's process ends hard after ``epoch``, once that epoch's checkpoint is on disk."""

    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.at = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at + 1:
            os._exit(9)


def main(run_dir: str, mode: str) -> None:
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.005), "sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = [EndAfter(2)] if mode == "interrupted" else []
    history = mpi_trainer.fit(model, x[:1500], y[:1500], batch_size=32, epochs=5, validation_data=(x[1500:], y[1500:]),
                              callbacks=callbacks, run_dir=run_dir, overrides={"checkpoint.every": 1})
    score = model.evaluate(x[1500:], y[1500:], verbose=0, return_dict=True)
    model.trainable = False
    model.layers[-1].trainable = True
    model.compile(keras.optimizers.Adam(1e-4), "sparse_categorical_crossentropy", metrics=["accuracy"])
    try:
        mpi_trainer.fit(model, x[:1500], y[:1500], batch_size=32, epochs=1, run_dir=run_dir)
        second = None
    except InputError as exc:
        second = str(exc)
    print(json.dumps({"rank": placed.rank, "history": history.history, "epoch": history.epoch,
                      "accuracy": score["accuracy"], "iterations": int(model.optimizer.iterations),
                      "second": second}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
