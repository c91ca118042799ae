"""A script for ``mpi-trainer launch -n 2 --run-dir D --set checkpoint.every=2 -- python launch_fit_job.py``.

It names no run directory: ``fit`` takes the launcher's, and its checkpoint interval comes from the
launcher's ``--set``. Eight rounds of digits, a short sleep after every batch so that a test can kill
a worker mid-run.
Rank 0 prints one JSON line with the rounds of the run (``history.rounds``, resumed ones included) and
its run directory.
"""

from __future__ import annotations

import json

import mpi_trainer

placed = mpi_trainer.init()

import keras  # noqa: E402 - after init(), which places the rank first
from sklearn.datasets import load_digits  # noqa: E402


def classifier(input_shape, num_outputs):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(num_outputs, activation="softmax")])


x, y = load_digits(return_X_y=True)
history = mpi_trainer.fit(classifier, x / 16.0, y, epochs=8, batch_size=32,
                          overrides={"log.plots": False, "debug.batch_delay": 0.02})
if placed.is_scheduler:
    print(json.dumps({"rounds": len(history.rounds["round"]), "run_dir": str(history.run_dir)}), flush=True)
