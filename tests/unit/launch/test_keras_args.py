"""keras.Model.fit's scalar arguments turned into config keys, refused as Keras refuses them."""

from __future__ import annotations

import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.keras_args import KerasFitArguments, fit_overrides, user_sets


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


def test_user_sets_reads_overrides_and_config_sections(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[data]\ntest_size = 0.1\n")
    assert user_sets("data.test_size", str(path), None)
    assert user_sets("data.test_size", None, ["data.test_size=0.2"])
    assert user_sets("train.epochs", {"train": {"epochs": 3}}, None)
    assert not user_sets("data.test_size", {"train": {}}, {"train.epochs": 2})

