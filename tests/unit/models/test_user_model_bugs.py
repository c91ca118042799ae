"""A bug in the user's model function reaches the user with its traceback; bad input stays one line."""

from __future__ import annotations

import traceback
from typing import Any

import keras
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.config import load_config
from mpi_trainer.errors import AgreedInputError, ConfigError
from mpi_trainer.launch.job_setup import JobInputs, claim_run_dir, setup
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


def test_set_up_fails_every_rank_and_the_scheduler_shows_the_user_s_traceback(tmp_path):
    """The job's own set-up on three in-process ranks: none waits, rank 0 raises the NameError itself."""
    cfg = load_config(None, ["data.source='digits'", "log.plots=false"])
    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> Any:
        inputs = JobInputs()
        inputs.builder = model_with_a_typo
        try:
            return setup(transports[index], cfg, inputs, claim_run_dir(transports[index], cfg, inputs,
                                                                         str(tmp_path / "run"), False))
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is what the test checks
            return exc

    outcome = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=120)
    assert type(outcome[0]) is NameError and "model_with_a_typo" in frames(outcome[0])
    for worker in (1, 2):
        assert isinstance(outcome[worker], AgreedInputError), outcome
        assert "NameError" in str(outcome[worker]) and "(reported by rank 0)" in str(outcome[worker])
