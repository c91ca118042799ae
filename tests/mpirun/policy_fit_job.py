"""A Keras script ported with the two documented lines, which names no policy: the tests set them from the
launching command line (``python -m mpi_trainer launch -n 3 --set KEY=VALUE ... -- python policy_fit_job.py``).
Each rank prints one JSON line: its History and a digest of its model's weights."""

from __future__ import annotations

import hashlib
import json

import mpi_trainer

placed = mpi_trainer.init()

import keras  # noqa: E402 - after init(), which places the rank first
from sklearn.datasets import load_digits  # noqa: E402

x, y = load_digits(return_X_y=True)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(keras.optimizers.Adam(0.005), "sparse_categorical_crossentropy", metrics=["accuracy"])
history = mpi_trainer.fit(model, x / 16.0, y, batch_size=32, epochs=4, validation_split=0.2, verbose=0)
digest = hashlib.sha256(b"".join(weight.tobytes() for weight in model.get_weights())).hexdigest()
print(json.dumps({"rank": placed.rank, "history": history.history, "weights": digest}), flush=True)
