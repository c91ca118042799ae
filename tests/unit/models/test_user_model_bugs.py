"""A bug in the user's model function reaches the user with its traceback; bad input stays one line."""

from __future__ import annotations

import traceback
from typing import Any

import keras
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.config import load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.models import build_model


def model_with_a_typo(input_shape, num_outputs):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(inputz))  # noqa: F821 - the user's bug


def model_that_refuses_its_own_argument(input_shape, num_outputs):
    raise ValueError("the user's own check failed")


def image_model(input_shape, num_outputs):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(keras.layers.Conv2D(4, 3)(inputs)))


def frames(exc: BaseException) -> list[str]:
    return [frame.name for frame in traceback.extract_tb(exc.__traceback__)]


def test_a_name_error_in_the_model_function_keeps_its_type_and_the_function_s_frame():
    cfg = load_config(None, []).model
    with pytest.raises(NameError, match="inputz") as info:
        build_model(cfg, (64,), 10, builder=model_with_a_typo)
    assert "model_with_a_typo" in frames(info.value)


def test_a_value_error_the_user_raised_is_a_bug_too():
    with pytest.raises(ValueError, match="the user's own check failed") as info:
        build_model(load_config(None, []).model, (64,), 10, builder=model_that_refuses_its_own_argument)
    assert not isinstance(info.value, ConfigError) and "model_that_refuses_its_own_argument" in frames(info.value)


def test_keras_refusing_a_model_built_for_other_data_is_one_line():
    with pytest.raises(ConfigError, match=r"cannot be built for input shape \(64,\) and 10 classes: ValueError: "
                                          r"Input 0 .* is incompatible with the layer"):
        build_model(load_config(None, []).model, (64,), 10, builder=image_model)


def test_a_bug_in_the_model_function_fails_every_rank_with_its_traceback_and_none_waits(tmp_path, monkeypatch):
    """The command line's job on three in-process ranks: each builds its own model, so each raises the
    user's NameError itself, with the function's frame, before any rank waits on another."""
    from mpi_trainer.trainer.config_fit import fit_config
    from tests.unit.trainer.test_fit_again import placed_in_place

    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)
    config = {"data": {"source": "digits"}, "train": {"epochs": 1}, "log": {"plots": False, "tensorboard": False}}
    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> Any:
        try:
            return fit_config(transports[index], load_config(config), config, [], str(tmp_path / "run"), False,
                              builder=model_with_a_typo)
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is what the test checks
            return exc

    outcome = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=120)
    for index in range(3):
        assert type(outcome[index]) is NameError, outcome
        assert "model_with_a_typo" in frames(outcome[index])
    assert not (tmp_path / "run").exists()  # nothing trained, no run directory claimed
