"""Keras callbacks at round granularity on the scheduler: Keras' names in the logs, Keras' file-writing
callbacks writing their files, a learning rate handed on, and BackupAndRestore refused."""

from __future__ import annotations

import csv

import keras
import numpy as np
import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.scheduler.callbacks import RoundCallbacks, check_callbacks


def compiled_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def row(round_index: int, val_loss: float) -> dict:
    return {"round": round_index, "train_loss": 1.0, "train_accuracy": 0.5, "val_loss": val_loss,
            "val_accuracy": 0.6, "test_loss": float("nan"), "test_accuracy": float("nan"), "wall_seconds": 2.0}


def test_keras_file_callbacks_write_what_model_fit_writes_and_history_has_keras_keys(tmp_path):
    model = compiled_model()
    callbacks = [keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                 keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_loss", save_best_only=True),
                 keras.callbacks.TensorBoard(str(tmp_path / "tb"))]
    check_callbacks(callbacks)
    rounds = RoundCallbacks(callbacks, model, 3, ["loss", "accuracy"], initial_epoch=2)
    rounds.begin(0)
    for index, val_loss in enumerate([0.9, 0.7, 0.8]):
        assert not rounds.round_end(index, row(index, val_loss))
    rounds.end()
    with open(tmp_path / "log.csv") as handle:
        lines = list(csv.DictReader(handle))
    assert [line["epoch"] for line in lines] == ["2", "3", "4"]  # rounds counted from initial_epoch
    assert set(lines[0]) == {"epoch", "loss", "accuracy", "val_loss", "val_accuracy"}
    assert keras.models.load_model(tmp_path / "best.keras").count_params() == model.count_params()
    assert any((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert rounds.history.history["val_loss"] == [0.9, 0.7, 0.8] and rounds.history.epoch == [2, 3, 4]


def test_a_learning_rate_set_by_a_callback_is_reported_once_for_the_workers():
    model = compiled_model()
    rounds = RoundCallbacks([keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 * 0.5 ** epoch)], model, 3,
                            ["loss", "accuracy"])
    rounds.begin(0)
    assert rounds.changed_learning_rate() is None  # epoch 0 keeps the compiled 0.1
    rounds.round_end(0, row(0, 0.5))
    assert rounds.changed_learning_rate() == pytest.approx(0.05)
    assert rounds.changed_learning_rate() is None


def test_reduce_lr_on_plateau_sees_the_real_validation_loss():
    model = compiled_model()
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5)
    rounds = RoundCallbacks([plateau], model, 4, ["loss", "accuracy"])
    rounds.begin(0)
    for index, val_loss in enumerate([0.5, 0.6, 0.7]):
        rounds.round_end(index, row(index, val_loss))
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.025)


def test_backup_and_restore_and_non_callbacks_are_refused_before_training(tmp_path):
    with pytest.raises(ConfigError, match="BackupAndRestore cannot restore a data-parallel run.*resume=True"):
        check_callbacks([keras.callbacks.BackupAndRestore(str(tmp_path))])
    with pytest.raises(ConfigError, match=r"must be keras.callbacks.Callback instances. Received: \['str'\]"):
        check_callbacks(["early_stopping"])
