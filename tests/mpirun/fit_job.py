"""The script test_mpirun_api.py runs under ``mpirun -n 3``: ``mpi_trainer.fit`` as a user calls it.

    python tests/mpirun/fit_job.py RUN_DIR MODE[,MODE...]
    MODE: shared | scattered | keras | refusals | built | init_built | caught

Every rank prints one JSON line per mode, ``{"rank": r, "mode": m, "result": ...}``, with what ``fit``
returned there. Several modes run one after another in the same processes, as a script that calls
``fit`` more than once does, each in ``RUN_DIR/<mode>`` (``built`` and ``init_built`` end the process:
they run alone).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import keras
from mpi4py import MPI
from sklearn.datasets import load_diabetes, load_digits

import mpi_trainer
from mpi_trainer.errors import InputError


class StopAfter(keras.callbacks.Callback):
    """Stops the job after ``rounds`` rounds; records what it saw."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds, self.epochs = rounds, []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.model.stop_training = epoch + 1 >= self.rounds


def classifier(input_shape, num_outputs):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(num_outputs, activation="softmax")])


def regressor(input_shape, num_outputs):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(num_outputs)])


def one_hot_model(input_shape, num_outputs):
    model = classifier(input_shape, num_outputs)
    model.compile("adam", "categorical_crossentropy")  # but the labels below are integers
    return model


def returned(history, model, x, y) -> dict:
    """What a rank holds after fit: the History, its run figures, and what its model scores on (x, y)."""
    probe = model.evaluate(x, y, verbose=0, return_dict=True)
    return {"history": history.history, "epoch": history.epoch, "rounds": history.rounds,
            "summary": history.summary, "run_dir": str(history.run_dir), "model_loss": probe["loss"],
            "model_accuracy": probe.get("accuracy"), "same_model": history.model is model}


def run(mode: str, run_dir: str, rank: int) -> dict | None:
    common = {"run_dir": run_dir,
              "overrides": {"log.plots": False, "log.tensorboard": False}}
    if mode == "scattered":  # regression; the workers pass no arrays, so their rows are sent to them
        x, y = load_diabetes(return_X_y=True)
        x, y = (x - x.mean(0)) / x.std(0), y / 100.0
        mine = (x, y) if rank == 0 else (None, None)
        # plain averaging: with Adam at 0.01 each round nearly converges, and the outer Nesterov step overshot
        # (validation MAE 0.82, 1.05, 0.87 over the 3 rounds)
        history = mpi_trainer.fit(regressor, *mine, epochs=3, validation_split=0.25,
                                  config={"model": {"loss": "mse", "metrics": ["mae"]},
                                          "aggregation": {"outer_optimizer": "none"}}, run_dir=run_dir,
                                  overrides={**common["overrides"], "model.learning_rate": 0.01})
        return {"history": history.history, "summary": history.summary,
                "model_mae": history.model.evaluate(x[-100:], y[-100:], verbose=0, return_dict=True)["mae"]}
    x, y = load_digits(return_X_y=True)
    if mode in ("built", "init_built"):
        return built_model(mode, run_dir, x / 16.0, y, common["overrides"])
    if mode == "keras":
        return keras_script(run_dir, x / 16.0, y)
    if mode == "caught":
        return sweep(run_dir, x / 16.0, y, common["overrides"])
    if mode == "refusals":
        return refusals(x / 16.0, y, rank, common)
    stop = StopAfter(2)
    model = classifier((64,), 10)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = mpi_trainer.fit(model, x / 16.0, y, batch_size=32, epochs=6, callbacks=[stop], **common)
    return {**returned(history, model, x[:50] / 16.0, y[:50]), "epochs_seen": stop.epochs}


def keras_script(run_dir: str, x, y) -> dict:
    """A Keras script's fit, ported: an unbuilt Sequential, validation data, EarlyStopping on val_loss with
    the best weights restored, and a LearningRateScheduler the workers must follow."""
    model = keras.Sequential([keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy", metrics=["accuracy"])
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch: 0.4 if epoch < 2 else 0.8)  # unstable later
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True)
    x_val, y_val = x[-300:], y[-300:]
    history = mpi_trainer.fit(model, x[:-300], y[:-300], batch_size=16, epochs=8, callbacks=[schedule, stop],
                              validation_data=(x_val, y_val), shuffle=False, run_dir=run_dir,
                              overrides={"log.plots": False, "log.tensorboard": False})
    # callbacks run on rank 0: their own state (best_epoch) is there only
    return {**returned(history, model, x_val, y_val), "best_epoch": getattr(stop, "best_epoch", None)}


def refusals(x, y, rank: int, common: dict) -> dict:
    """Jobs that fit refuses before training, one after another in the same processes: arguments Keras refuses
    (each worker's share of them), a model that does not fit its labels (every rank's dry run), x without y on
    rank 2 alone, inputs by name for a model function (a keras.Model takes them), and validation data without x
    (the data is then the config's source). What each rank's fit raised."""
    jobs = {"refused": lambda: mpi_trainer.fit(classifier, x, y, epochs=3, sample_weight=y[:10] * 0 + 1, **common),
            "mismatch": lambda: mpi_trainer.fit(one_hot_model, x, y, epochs=3, **common),
            "half_arguments": lambda: mpi_trainer.fit(classifier, x, None if rank == 2 else y, epochs=3, **common),
            "by_name": lambda: mpi_trainer.fit(classifier, {"pixels": x}, y, epochs=3, **common),
            "no_x": lambda: mpi_trainer.fit(classifier, validation_data=(x, y), epochs=3, **common)}
    raised = {}
    for name, job in jobs.items():
        try:
            job()
            raised[name] = None
        except InputError as exc:
            raised[name] = str(exc)
    return {"raised": raised}


class BreaksAt(keras.callbacks.Callback):
    """Raises on the scheduler after round ``at``, as a user's callback with a bug would."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError(f"callback broke after round {epoch}")


def sweep(run_dir: str, x, y, overrides: dict) -> dict:
    """Two jobs in a loop that catches each failure, as a hyper-parameter sweep does: the first breaks on
    rank 0 after round 1, the second trains. What each rank got, and how long it took to get it."""
    outcomes = []
    for index, callbacks in enumerate([[BreaksAt(1)], []]):
        started = time.monotonic()
        try:
            result = mpi_trainer.fit(classifier, x, y, epochs=4, batch_size=32, callbacks=callbacks,
                                     run_dir=f"{run_dir}-{index}", overrides=overrides)
            outcome = {"rounds": len(result.history["loss"])}
        except Exception as exc:  # noqa: BLE001 - the sweep goes on, as a user's would
            outcome = {"error": f"{type(exc).__name__}: {exc}", "failed_at": time.time()}
        outcomes.append({**outcome, "seconds": time.monotonic() - started})
    return {"jobs": outcomes}


def built_model(mode: str, run_dir: str, x, y, overrides: dict) -> dict | None:
    """A model built and run before ``fit`` (the backend has started): after ``mpi_trainer.init()``
    (init_built), or without it (built). init_built then asks a second job for other threads."""
    if mode == "init_built":
        placed = mpi_trainer.init(threads=1)
        assert placed.rank == MPI.COMM_WORLD.Get_rank() and placed.size == 3
        assert placed.is_scheduler == (placed.rank == 0) and placed.device == "cpu"
    model = classifier((64,), 10)
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.predict(x[:2], verbose=0)
    history = mpi_trainer.fit(model, x, y, epochs=2, run_dir=run_dir, overrides=overrides)
    out = {"summary": history.summary}
    print(json.dumps({"rank": MPI.COMM_WORLD.Get_rank(), "mode": mode, "result": out}), flush=True)
    if mode == "init_built":  # a process placed at 1 thread cannot train a job at 2
        mpi_trainer.fit(model, x, y, epochs=1, run_dir=run_dir + "-again", overrides={**overrides, "train.threads": 2})
    sys.exit(0)


if __name__ == "__main__":
    rank, modes = MPI.COMM_WORLD.Get_rank(), sys.argv[2].split(",")
    for mode in modes:
        out = run(mode, sys.argv[1] if len(modes) == 1 else str(Path(sys.argv[1]) / mode), rank)
        print(json.dumps({"rank": rank, "mode": mode, "result": out}), flush=True)
