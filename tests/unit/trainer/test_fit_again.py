"""A fit run again on its run directory: a complete run trains nothing and hands every rank that run's result; a
preempted one resumes where it checkpointed. ``fit_model`` on a scheduler and two workers as threads of a
LocalWorld, each with its own copy of the model."""

from __future__ import annotations

import json
from typing import Any

import keras
import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.errors import Preempted
from mpi_trainer.launch.devices import RankPlacement
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer.fit import fit_model

X = np.random.default_rng(0).normal(size=(48, 4)).astype("float32")
Y = (X[:, 0] > 0).astype("int64")


def small_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def placed_in_place(transport: Any, cfg: Any) -> tuple[Any, list[RankPlacement]]:
    """The ranks share one process here: no device or thread placement, only every rank's description."""
    role = "scheduler" if transport.rank == 0 else "worker"
    return cfg, transport.allgather(RankPlacement(transport.rank, "local", transport.rank, role, "tensorflow", "cpu"))


def fit_everywhere(run_dir: Any, epochs: int = 2, shuffle: bool = True) -> dict[int, dict[str, Any]]:
    """Every rank's History and final weights after a fit of ``epochs`` into ``run_dir`` (or the exception
    it raised there, as ``raised``)."""
    world = LocalWorld(3)
    transports = world.transports()
    models = {rank: small_model() for rank in range(3)}

    def rank(index: int) -> dict[str, Any]:
        kwargs = {"x": X, "y": Y, "batch_size": 8, "epochs": epochs, "verbose": 0, "validation_split": 0.25,
                  "shuffle": shuffle, "initial_epoch": 0, "validation_freq": 1}
        try:
            history = fit_model(transports[index], models[index], kwargs, None, [], run_dir, False)
        except Preempted as exc:
            return {"raised": exc}
        return {"history": history.history, "epoch": list(history.epoch), "summary": history.summary,
                "weights": models[index].get_weights(), "model_history": models[index].history}

    return world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=120)


@pytest.fixture
def start_in_place(monkeypatch):
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)


def test_a_complete_run_fitted_again_returns_its_history_and_weights_on_every_rank(tmp_path, start_in_place):
    run_dir = tmp_path / "run"
    first = fit_everywhere(run_dir)
    names = ("rounds.csv", "summary.json", "fit.json", "checkpoint.h5")
    files = {name: (run_dir / name).read_bytes() for name in names}
    again = fit_everywhere(run_dir)
    assert set(first[0]["history"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for rank in range(3):
        assert again[rank]["epoch"] == first[0]["epoch"] == [0, 1]
        assert again[rank]["history"] == first[0]["history"]
        assert again[rank]["summary"] == first[0]["summary"]
        assert again[rank]["model_history"] is not None
        for mine, finished in zip(again[rank]["weights"], first[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, finished)
    assert len((run_dir / "rounds.csv").read_text().splitlines()) == 1 + 2  # the header, then one row per epoch
    assert {name: (run_dir / name).read_bytes() for name in files} == files


class SignalAfterOneEpoch(Preemption):
    """A preemption signal that reaches every rank while its second epoch trains: each rank asks once an epoch."""

    def install(self, names, grace_seconds, on_expire):  # threads cannot take signals: no handlers
        self.asked = 0

    @property
    def requested(self) -> bool:
        self.asked += 1
        return self.asked >= 2


def test_a_preempted_fit_checkpoints_every_rank_exits_75_and_the_same_fit_resumes_to_the_same_result(
        tmp_path, start_in_place, monkeypatch):
    uninterrupted = fit_everywhere(tmp_path / "whole", epochs=3, shuffle=False)
    with monkeypatch.context() as patched:
        patched.setattr("mpi_trainer.trainer.fit.Preemption", SignalAfterOneEpoch)
        preempted = fit_everywhere(tmp_path / "run", epochs=3, shuffle=False)
    assert all(isinstance(preempted[rank].get("raised"), Preempted) for rank in range(3)), preempted
    assert preempted[0]["raised"].code == 75
    assert len((tmp_path / "run" / "rounds.csv").read_text().splitlines()) == 1 + 2  # epochs 0 and 1, checkpointed
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "preempted"
    resumed = fit_everywhere(tmp_path / "run", epochs=3, shuffle=False)
    for rank in range(3):
        assert resumed[rank]["epoch"] == [0, 1, 2]
        assert resumed[rank]["history"] == uninterrupted[0]["history"]
        for mine, whole in zip(resumed[rank]["weights"], uninterrupted[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, whole)
    assert resumed[0]["summary"]["stop_reason"] == "epochs"
