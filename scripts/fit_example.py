"""Train from Python: `mpirun -n 3 python scripts/fit_example.py` (rank 0 schedules, 2 workers train)."""

import keras
from sklearn.datasets import load_digits

import mpi_trainer


def build(input_shape, num_outputs):  # called on the scheduler; workers rebuild its architecture
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(64, activation="relu"),
                             keras.layers.Dense(num_outputs, activation="softmax")])


x, y = load_digits(return_X_y=True)  # every rank may pass the arrays (only indices travel) or None
stop = keras.callbacks.EarlyStopping(monitor="test_accuracy", mode="max", patience=2)
result = mpi_trainer.fit(build, x / 16.0, y, epochs=10, batch_size=32, callbacks=[stop],
                         overrides={"model.learning_rate": 0.01, "log.plots": False})
if result is not None:  # rank 0
    print(f"test accuracy per round: {[round(a, 3) for a in result.history['test_accuracy']]}")
    print(f"run directory: {result.run_dir}; model: {result.model.count_params()} parameters")
