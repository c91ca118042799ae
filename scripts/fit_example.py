"""Train from Python: `mpirun -n 3 python scripts/fit_example.py` (rank 0 schedules, 2 workers train)."""

import mpi_trainer

placed = mpi_trainer.init()  # before Keras starts: each rank's device and threads

import keras  # noqa: E402 - after init()
from sklearn.datasets import load_digits  # noqa: E402

x, y = load_digits(return_X_y=True)  # every rank passes the same arrays: only block indices travel
model = keras.Sequential([keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10, activation="softmax")])
model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
history = mpi_trainer.fit(model, x / 16.0, y, batch_size=32, epochs=10, validation_split=0.2, callbacks=[stop])
if placed.is_scheduler:  # every rank holds the same History and weights; one prints
    print(f"val_accuracy per round: {[round(a, 3) for a in history.history['val_accuracy']]}")
    loss, accuracy = model.evaluate(x / 16.0, y, verbose=0)  # the model passed in holds the final weights
    print(f"model: {model.count_params()} parameters; loss {loss:.3f}, accuracy {accuracy:.3f}")
