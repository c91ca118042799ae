"""The script test_mpirun_api.py runs under ``mpirun -n 3``: ``mpi_trainer.fit`` as a user calls it.

    python tests/mpirun/fit_job.py RUN_DIR shared | scattered | mismatch | half_arguments | built | init_built | caught

Rank 0 prints one JSON line with what ``fit`` returned; workers print ``{"worker": rank, "result": null}``.
"""

from __future__ import annotations

import json
import sys
import time

import keras
from mpi4py import MPI
from sklearn.datasets import load_diabetes, load_digits

import mpi_trainer


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


def run(mode: str, run_dir: str, rank: int) -> dict | None:
    common = {"run_dir": run_dir,
              "overrides": {"log.plots": False, "log.tensorboard": False, "model.learning_rate": 0.01}}
    if mode == "scattered":  # regression; the workers pass no arrays, so their rows are sent to them
        x, y = load_diabetes(return_X_y=True)
        x, y = ((x - x.mean(0)) / x.std(0), y / 100.0) if rank == 0 else (None, None)
        result = mpi_trainer.fit(regressor, x, y, epochs=3, config={"model": {"loss": "mse", "metrics": ["mae"]}},
                                 **common)
        return None if result is None else {"history": result.history, "summary": result.summary}
    x, y = load_digits(return_X_y=True)
    if mode in ("built", "init_built"):
        return built_model(mode, run_dir, x / 16.0, y, common["overrides"])
    if mode == "mismatch":
        mpi_trainer.fit(one_hot_model, x / 16.0, y, epochs=3, **common)
        return {"unreachable": True}
    if mode == "caught":
        return sweep(run_dir, x / 16.0, y, common["overrides"])
    if mode == "half_arguments":  # rank 2 alone passes x without y
        mpi_trainer.fit(classifier, x / 16.0, None if rank == 2 else y, epochs=3, **common)
        return {"unreachable": True}
    stop = StopAfter(2)
    result = mpi_trainer.fit(classifier, x / 16.0, y, epochs=6, batch_size=32, callbacks=[stop], **common)
    if result is None:
        return None
    probe = result.model.evaluate(x[:50] / 16.0, y[:50], verbose=0, return_dict=True)
    return {"history": result.history, "summary": result.summary, "epochs_seen": stop.epochs,
            "model_accuracy": probe["accuracy"], "run_dir": str(result.run_dir)}


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
            outcome = {"rounds": None if result is None else len(result.history["test_loss"])}
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
    model.predict(x[:2], verbose=0)
    result = mpi_trainer.fit(model, x, y, epochs=2, run_dir=run_dir, overrides=overrides)
    out = None if result is None else {"summary": result.summary}
    print(json.dumps({"rank": MPI.COMM_WORLD.Get_rank(), "result": out}), flush=True)
    if mode == "init_built":  # a process placed at 1 thread cannot train a job at 2
        mpi_trainer.fit(model, x, y, epochs=1, run_dir=run_dir + "-again", overrides={**overrides, "train.threads": 2})
    sys.exit(0)


if __name__ == "__main__":
    rank = MPI.COMM_WORLD.Get_rank()
    out = run(sys.argv[2], sys.argv[1], rank)
    print(json.dumps({"rank": rank, "result": out}), flush=True)
