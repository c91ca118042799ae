"""Epochs of a fit on the user's model, in one process: a scheduler and two workers as threads of a
LocalWorld, each with its own copy of a small BatchNormalization model, as each rank of a job holds one."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.keras_fit.record import FitRecord
from mpi_trainer.keras_fit.rounds import SchedulerRounds, WorkerRounds
from mpi_trainer.keras_fit.shares import array_share
from mpi_trainer.keras_fit.state import ModelState


def bn_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.ReLU(), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 8)).astype("float32") * 0.01  # a variance far below BatchNorm's initial 1
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")


class SetRate(keras.callbacks.Callback):
    """Sets the learning rate on the scheduler's model before epoch 1, as ReduceLROnPlateau would."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.model.optimizer.learning_rate = 0.002


def run_job(outer: str, epochs: int = 3, shuffle: bool = True) -> dict[int, dict]:
    x, y = data()
    world = LocalWorld(3)
    transports = world.transports()
    models = {rank: bn_model() for rank in range(3)}

    def scheduler() -> dict:
        model = models[0]
        state = ModelState(model)
        callbacks = keras.callbacks.CallbackList([SetRate()], add_history=True, model=model, epochs=epochs,
                                                 steps=None, verbose=0)
        optimizer = OuterOptimizer(OuterSettings(outer, 1.0, 0.5))
        rounds = SchedulerRounds(transports[0], model, state, optimizer, callbacks,
                                 {"x": x[:60], "y": y[:60]}, 1, FitRecord(None, {}, {}))
        rounds.run(0, epochs)
        return {"history": callbacks.callbacks[-1].history, "weights": model.get_weights(),
                "moments": [np.asarray(v) for v in model.optimizer.variables],
                "iterations": int(model.optimizer.iterations), "rate": float(model.optimizer.learning_rate)}

    def worker(rank: int) -> dict:
        model = models[rank]
        share_x, share_y, _ = array_share((x, y, None), 2, rank - 1, True)
        share = {"x": share_x, "y": share_y, "batch_size": 30, "shuffle": shuffle}
        WorkerRounds(transports[rank], model, ModelState(model), share, len(share_x), False).run()
        return {"weights": model.get_weights(), "iterations": int(model.optimizer.iterations),
                "moments": [np.asarray(v) for v in model.optimizer.variables],
                "rate": float(model.optimizer.learning_rate)}

    return world.run({0: scheduler, 1: lambda: worker(1), 2: lambda: worker(2)}, timeout=180)


@pytest.fixture(scope="module")
def nesterov() -> dict[int, dict]:
    return run_job("nesterov")


def test_every_rank_ends_with_the_same_state_and_the_steps_one_worker_took(nesterov):
    for rank in (1, 2):
        for mine, theirs in zip(nesterov[0]["weights"], nesterov[rank]["weights"]):
            np.testing.assert_array_equal(mine, theirs)
        assert nesterov[rank]["iterations"] == nesterov[0]["iterations"]
    assert nesterov[0]["iterations"] == 3 * 4  # 3 epochs of 120 rows in batches of 30, on each worker


def test_batchnorm_statistics_are_averaged_not_stepped_by_the_outer_optimizer(nesterov):
    model = bn_model()
    model.set_weights(nesterov[0]["weights"])
    bn = model.layers[1]
    assert np.all(np.asarray(bn.moving_variance) > 0)  # an outer step on these drives them negative
    history = nesterov[0]["history"]
    assert np.all(np.isfinite(history["val_loss"])), history  # a negative variance scores NaN
    assert history["val_accuracy"][-1] > 0.6, history  # the statistics are those the weights trained with


def test_the_schedulers_learning_rate_reaches_the_workers_and_is_not_averaged(nesterov):
    for rank in (0, 1, 2):
        assert nesterov[rank]["rate"] == pytest.approx(0.002)


def test_history_holds_the_workers_training_logs_and_the_schedulers_validation(nesterov):
    history = nesterov[0]["history"]
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(values) == 3 for values in history.values())
    assert history["loss"][-1] < history["loss"][0]


def test_without_an_outer_optimizer_the_state_is_the_workers_mean():
    plain = run_job("none", epochs=1, shuffle=False)
    x, y = data()
    alone = []
    for rank in (1, 2):  # each worker's epoch, replayed alone from the same start on the same share
        model = bn_model()
        share_x, share_y, _ = array_share((x, y, None), 2, rank - 1, True)
        model.fit(share_x, share_y, batch_size=30, epochs=1, verbose=0, shuffle=False)
        alone.append((model.get_weights(), [np.asarray(v) for v in model.optimizer.variables]))
    for index, combined in enumerate(plain[0]["weights"]):  # trainable and BatchNorm statistics alike
        np.testing.assert_allclose(combined, (alone[0][0][index] + alone[1][0][index]) / 2, rtol=1e-5, atol=1e-6)
    for index, combined in enumerate(plain[0]["moments"]):
        if combined.dtype.kind == "f" and combined.size > 1:  # Adam's moments: averaged too
            np.testing.assert_allclose(combined, (alone[0][1][index] + alone[1][1][index]) / 2, rtol=1e-5,
                                       atol=1e-7)
