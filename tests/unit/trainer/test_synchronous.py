"""Synchronous SGD against one process: N steps on two workers equal N steps of one process on the concatenated
batches (each step's global batch is worker 1's batch followed by worker 2's). ``fit_model`` on a scheduler and
two workers as threads of a LocalWorld, against plain ``model.fit`` in this process."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.errors import InputError
from mpi_trainer.trainer.fit import fit_model
from tests.unit.trainer.test_fit_again import placed_in_place

rng = np.random.default_rng(5)
ROWS, BATCH, EPOCHS = 100, 16, 3  # 50 rows a worker: 4 steps an epoch, the last of 2 rows each
X = rng.normal(size=(ROWS, 6, 6, 1)).astype("float32")
Y = (X[:, :3].mean(axis=(1, 2, 3)) > X[:, 3:].mean(axis=(1, 2, 3))).astype("int64")
X_VAL, Y_VAL = X[:20] * 0.9, Y[:20]


def dense(optimizer: Any) -> keras.Model:
    model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Flatten(), keras.layers.Dense(10, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def conv(optimizer: Any) -> keras.Model:
    model = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
              "adam": lambda: keras.optimizers.Adam(0.01, clipnorm=1.0)}


def global_batches() -> tuple[np.ndarray, np.ndarray]:
    """The rows in the order one process takes them with a batch of 2 * BATCH: step t's batch is worker 1's t-th
    batch, then worker 2's."""
    half = ROWS // 2
    order = []
    for start in range(0, half, BATCH):
        order += list(range(start, min(start + BATCH, half))) + list(range(half + start, min(half + start + BATCH,
                                                                                               ROWS)))
    return X[order], Y[order]


@pytest.fixture(autouse=True)
def start_in_place(monkeypatch):
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)


def synchronous_fit(build: Any, overrides: list[str] | None = None) -> dict[int, Any]:
    world = LocalWorld(3)
    transports = world.transports()
    models = []
    for _ in range(3):
        keras.utils.set_random_seed(2)
        models.append(build())

    def rank(index: int) -> Any:
        arguments = {"x": X, "y": Y, "batch_size": BATCH, "epochs": EPOCHS, "verbose": 0, "shuffle": False,
                     "validation_data": (X_VAL, Y_VAL)}
        history = fit_model(transports[index], models[index], arguments, None,
                            ["aggregation.method=synchronous", *(overrides or [])], None, False)
        return {"history": history.history, "weights": models[index].get_weights(), "summary": history.summary,
                "rounds": history.rounds, "iterations": int(models[index].optimizer.iterations)}

    return world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=180)


@pytest.mark.parametrize("architecture", [dense, conv], ids=["dense", "conv"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_two_workers_take_the_steps_one_process_takes_on_the_concatenated_batches(architecture, optimizer):
    build = lambda: architecture(OPTIMIZERS[optimizer]())  # noqa: E731
    keras.utils.set_random_seed(2)
    reference = build()
    x, y = global_batches()
    plain = reference.fit(x, y, batch_size=2 * BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                          validation_data=(X_VAL, Y_VAL))
    result = synchronous_fit(build)
    for rank in range(3):  # every rank ends with the one process' weights and step count
        for mine, expected in zip(result[rank]["weights"], reference.get_weights(), strict=True):
            np.testing.assert_allclose(mine, expected, rtol=1e-4, atol=1e-5)
        assert result[rank]["iterations"] == int(reference.optimizer.iterations) == EPOCHS * 4
    for key in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(result[0]["history"][key], plain.history[key], rtol=1e-4, atol=1e-5)
    # the training loss: the mean of the workers' (equal batches: one process' mean over the global batches)
    np.testing.assert_allclose(result[0]["history"]["loss"], plain.history["loss"], rtol=1e-4, atol=1e-5)
    assert result[0]["summary"]["outer_optimizer"] == "none"


def test_the_steps_sums_are_counted_in_each_epochs_bytes():
    result = synchronous_fit(lambda: dense(keras.optimizers.SGD(0.1)))
    gradient_bytes = sum(int(np.prod(w.shape)) for w in result[1]["weights"]) * 4
    # each worker sends and receives every step's gradients (4 steps and the closing sum an epoch) at least once
    assert min(result[0]["rounds"]["bytes"]) >= 2 * 5 * gradient_bytes


@pytest.mark.parametrize("override, named", [
    ("aggregation.ssp=1", "aggregation.ssp"),
    ("train.sync_every=2", "train.sync_every"),
    ("fault.survive=true", "fault.survive"),
    ("aggregation.outer_optimizer=nesterov", "aggregation.outer_optimizer"),
])
def test_what_needs_rounds_of_local_steps_is_refused_before_training_naming_it(override, named):
    with pytest.raises(InputError, match=rf"'synchronous' cannot be combined with {named}="):
        synchronous_fit(lambda: dense(keras.optimizers.SGD(0.1)), [override])


class TwoOptimizers(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.net = dense(keras.optimizers.SGD(0.1))
        self.other = keras.optimizers.Adam()

    def call(self, inputs):
        return self.net(inputs)


def test_a_model_with_several_optimizers_is_refused_naming_them():
    def build() -> keras.Model:
        model = TwoOptimizers()
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        return model

    with pytest.raises(InputError, match=r"trains with 3 optimizers \(SGD, Adam, SGD\)"):
        synchronous_fit(build)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow" or importlib.util.find_spec("jax") is None,
                    reason="run once, from the TensorFlow suite, where JAX is installed")
def test_the_same_holds_on_jax():
    """This module's equality tests again with KERAS_BACKEND=jax (a backend is chosen once a process)."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist",
                           "-p", "no:cacheprovider", str(Path(__file__).relative_to(root)), "-k", "concatenated"],
                          cwd=root, env={**os.environ, "KERAS_BACKEND": "jax"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 passed" in done.stdout


def test_on_jax_a_rank_held_to_one_core_is_refused_naming_its_cores(monkeypatch):
    """JAX's host callback takes a thread of the CPU client besides the step's; the client has one a core."""
    from mpi_trainer.launch import runtime
    from mpi_trainer.trainer.synchronous import synchronous_refusal

    model = dense(keras.optimizers.SGD(0.1))
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(runtime, "usable_cores", lambda: 1)
    refused = synchronous_refusal(model)
    assert refused is not None and "Received: this rank may use 1 core; expected at least 2" in refused
    monkeypatch.setattr(runtime, "usable_cores", lambda: 2)
    assert synchronous_refusal(model) is None
