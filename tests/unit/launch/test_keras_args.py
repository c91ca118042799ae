"""keras.Model.fit's arguments turned into config keys and this rank's arrays, as Keras reads them."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.keras_args import KerasFitArguments, fit_overrides, rank_data, user_sets
from mpi_trainer.scheduler.callbacks import keras_logs


def test_scalar_arguments_become_config_keys():
    args = KerasFitArguments(batch_size=16, epochs=10, verbose=0, shuffle=False, initial_epoch=4,
                             steps_per_epoch=5, validation_freq=2)
    assert dict(fit_overrides(args)) == {"train.batch_size": 16, "train.epochs": 6, "log.verbosity": 0,
                                         "train.shuffle": False, "train.sync_every": 5, "evaluation.every": 2}
    assert fit_overrides(KerasFitArguments()) == []  # Keras' defaults leave the config as it is


@pytest.mark.parametrize("args, fragment", [
    (KerasFitArguments(epochs=3, initial_epoch=3), "Received: epochs=3, initial_epoch=3"),
    (KerasFitArguments(batch_size=0), "`batch_size` must be a positive integer. Received: batch_size=0"),
    (KerasFitArguments(verbose=3), "Received: verbose=3"),
    (KerasFitArguments(shuffle="batch"), "Received: shuffle='batch'"),
    (KerasFitArguments(validation_freq=[1, 2]), "Received: validation_freq=[1, 2]"),
    (KerasFitArguments(validation_split=1.0), "Received: validation_split=1.0"),
])
def test_values_fit_cannot_honour_are_refused_naming_them(args, fragment):
    with pytest.raises(ConfigError) as info:
        fit_overrides(args)
    assert fragment in str(info.value)


def test_validation_split_takes_the_last_rows_as_keras_does():
    x, y, w = np.arange(20).reshape(10, 2), np.arange(10), np.arange(10, dtype=float)
    arrays = rank_data(x, y, w, 0.25, None)
    assert arrays.y.tolist() == list(range(7)) and arrays.y_val.tolist() == [7, 8, 9]  # floor(10 * 0.75) = 7
    assert arrays.sample_weight.tolist() == list(range(7)) and arrays.x_val.tolist()[0] == [14, 15]


def test_validation_data_wins_over_validation_split_and_validation_steps_caps_its_rows():
    x, y = np.zeros((10, 2)), np.zeros(10, dtype=int)
    arrays = rank_data(x, y, None, 0.5, (np.ones((6, 2)), np.ones(6, dtype=int), None), rows_cap=4)
    assert len(arrays.y) == 10 and len(arrays.y_val) == 4


@pytest.mark.parametrize("call, fragment", [
    (lambda: rank_data(np.zeros((3, 1)), {"a": np.zeros(3)}, None, 0.0, None), "Received: y=dict with keys ['a']"),
    (lambda: rank_data({"a": np.zeros((3, 1))}, np.zeros(3), None, 0.0, (np.zeros((1, 1)), np.zeros(1))),
     "`validation_data[0]` must hold the same inputs"),
    (lambda: rank_data(np.zeros((3, 1)), np.zeros(3), np.ones(2), 0.0, None), "one per row of `x`"),
    (lambda: rank_data(np.zeros((3, 1)), np.zeros(3), None, 0.0, (np.zeros((1, 1)),)), "`validation_data` must"),
    (lambda: rank_data(np.zeros((3, 1)), np.zeros(3), None, 0.0, (np.zeros((1, 1)), np.zeros(1), np.ones(1))),
     "with sample weights is not supported"),
    (lambda: rank_data(np.zeros((3, 1)), None, None, 0.0, None), "`x` and `y` go together"),
])
def test_bad_data_arguments_are_refused_naming_them(call, fragment):
    with pytest.raises(ConfigError) as info:
        call()
    assert fragment in str(info.value)


def test_user_sets_reads_overrides_and_config_sections(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[data]\ntest_size = 0.1\n")
    assert user_sets("data.test_size", str(path), None)
    assert user_sets("data.test_size", None, ["data.test_size=0.2"])
    assert user_sets("train.epochs", {"train": {"epochs": 3}}, None)
    assert not user_sets("data.test_size", {"train": {}}, {"train.epochs": 2})


def test_round_rows_become_keras_logs():
    row = {"train_loss": 0.5, "train_accuracy": 0.8, "val_loss": 0.6, "val_accuracy": float("nan"),
           "test_loss": float("nan"), "wall_seconds": 1.0, "winner": ""}
    assert keras_logs(row, ["loss", "accuracy"]) == {"loss": 0.5, "accuracy": 0.8, "val_loss": 0.6}
