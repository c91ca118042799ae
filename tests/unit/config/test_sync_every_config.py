"""``train.sync_every`` and ``evaluation.every``: bad values and combinations fail before any rank starts."""

from __future__ import annotations

import pytest

from mpi_trainer.config import load_config
from mpi_trainer.errors import ConfigError

QUICKSTART = "configs/quickstart.toml"


def test_sync_every_defaults_to_one_local_epoch_and_scoring_once_per_local_epoch():
    cfg = load_config(QUICKSTART)
    assert cfg.train.sync_every == 0 and cfg.evaluation.every == 0
    assert load_config(QUICKSTART, ["train.sync_every=5", "evaluation.every=10"]).train.sync_every == 5
    auto = load_config(QUICKSTART, ["train.sync_every=auto", "data.increment.enabled=true"]).train
    assert (auto.sync_every, auto.sync_auto, auto.sync_steps) == ("auto", True, 0)  # whole epochs with increment


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.sync_every=-1", "`train.sync_every` must be >= 0. Received: train.sync_every=-1"),
        ("train.sync_every=1.5", "`train.sync_every` must be one of int or 'auto'. Received: train.sync_every=1.5"),
        ("evaluation.every=-1", "`evaluation.every` must be >= 0. Received: evaluation.every=-1"),
    ],
)
def test_bad_values_name_key_value_and_expectation(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [override])
    assert message in str(info.value)


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.increment.enabled=true", "data.increment.enabled"),
        ("data.rebalance=true", "data.rebalance"),
    ],
)
def test_what_k_step_rounds_cannot_honour_is_refused(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, ["train.sync_every=4", override])
    text = str(info.value)
    assert text.startswith(f"`train.sync_every` = 4 cannot be combined with {key}=True: ")
    assert text.endswith(f"Received: train.sync_every=4, {key}=True; expected {key} = false, or train.sync_every = 0")


@pytest.mark.parametrize("override", ["train.sync_every=2", "evaluation.every=3"])
def test_lbfgs_refuses_local_steps_and_sparse_evaluation(override):
    with pytest.raises(ConfigError, match=r"is not available with model.optimizer='lbfgs'") as info:
        load_config(QUICKSTART, ["model.optimizer='lbfgs'", "model.name='softmax_regression'", override])
    assert str(info.value).endswith(f"Received: {override} with model.optimizer='lbfgs'")


# -- post-local SGD's warm-up (train.sync_warmup_epochs / train.sync_warmup_every) ---------------
def test_the_warm_up_is_off_by_default_and_takes_epochs_and_steps():
    cfg = load_config(QUICKSTART)
    assert (cfg.train.sync_warmup_epochs, cfg.train.sync_warmup_every) == (0, 1)
    cfg = load_config(QUICKSTART, ["train.sync_warmup_epochs=2", "train.sync_warmup_every=4"])
    assert (cfg.train.sync_warmup_epochs, cfg.train.sync_warmup_every) == (2, 4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.sync_warmup_epochs=-1"],
         "`train.sync_warmup_epochs` must be >= 0. Received: train.sync_warmup_epochs=-1"),
        (["train.sync_warmup_epochs=1", "train.sync_warmup_every=0"],
         "`train.sync_warmup_every` must be > 0. Received: train.sync_warmup_every=0"),
        (["train.sync_warmup_every=3"],
         "`train.sync_warmup_every` sets the steps per round of a warm-up, and there is none: set "
         "train.sync_warmup_epochs > 0 as well. Received: train.sync_warmup_every=3 with train.sync_warmup_epochs=0"),
    ],
)
def test_bad_warm_up_values_name_key_value_and_expectation(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, overrides)
    assert message in str(info.value)


@pytest.mark.parametrize(
    "override, received",
    [
        ("aggregation.ssp=1", "aggregation.ssp=1"),
        ("data.increment.enabled=true", "data.increment.enabled=True"),
        ("data.rebalance=true", "data.rebalance=True"),
    ],
)
def test_what_the_warm_up_cannot_honour_is_refused(override, received):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, ["train.sync_warmup_epochs=1", override])
    text = str(info.value)
    assert text.startswith(f"`train.sync_warmup_epochs` = 1 cannot be combined with {received}: ")
    assert f"Received: train.sync_warmup_epochs=1, {received}; expected {received.split('=')[0]} = " in text
    assert text.endswith("or train.sync_warmup_epochs = 0")


def test_lbfgs_refuses_a_warm_up():
    with pytest.raises(ConfigError, match=r"is not available with model.optimizer='lbfgs'") as info:
        load_config(QUICKSTART, ["model.optimizer='lbfgs'", "model.name='softmax_regression'",
                                 "train.sync_warmup_epochs=1"])
    assert str(info.value).endswith("Received: train.sync_warmup_epochs=1 with model.optimizer='lbfgs'")

