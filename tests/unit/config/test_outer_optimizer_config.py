"""The aggregation.outer_* keys: defaults, each optimizer's learning rate, bad values and refused combinations."""

from __future__ import annotations

import pytest

from mpi_trainer.config import Config, load_config
from mpi_trainer.config.schema import OUTER_LEARNING_RATES
from mpi_trainer.errors import ConfigError

QUICKSTART = "configs/quickstart.toml"


def test_the_default_steps_nesterov_on_averaged_rounds_only_and_each_optimizer_brings_its_learning_rate():
    assert Config().aggregation.outer_optimizer == "auto" and Config().outer_optimizer_for(2) == "nesterov"
    assert Config().outer_optimizer_for(1) == "none"  # one worker: nothing is averaged
    for other in ("aggregation.ssp=1", "aggregation.method='best'", "model.optimizer='lbfgs'",
                  "aggregation.outer_optimizer='none'"):  # no round average to step from, or asked for none
        assert load_config(QUICKSTART, [other]).outer_optimizer_for(3) == "none", other
    assert load_config(QUICKSTART, ["aggregation.method='weighted'"]).outer_optimizer_for(3) == "nesterov"
    adam = load_config(QUICKSTART, ["aggregation.outer_optimizer='adam'"])
    assert adam.outer_optimizer_for(1) == adam.outer_optimizer_for(3) == "adam"  # a named one is taken as named
    for name, rate in OUTER_LEARNING_RATES.items():
        cfg = load_config(QUICKSTART, [f"aggregation.outer_optimizer='{name}'"])
        assert cfg.aggregation.outer_learning_rate == rate
    chosen = load_config(QUICKSTART, ["aggregation.outer_optimizer='adam'", "aggregation.outer_learning_rate=0.02"])
    assert chosen.aggregation.outer_learning_rate == 0.02


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("aggregation.outer_optimizer='sgd'", "`aggregation.outer_optimizer` must be one of ['auto', 'none', "
                                              "'momentum', 'nesterov', 'adam']. Received: "
                                              "aggregation.outer_optimizer='sgd'"),
        ("aggregation.outer_learning_rate=-1", "`aggregation.outer_learning_rate` must be > 0, or 0 for the outer "
                                               "optimizer's default. Received: aggregation.outer_learning_rate=-1.0"),
        ("aggregation.outer_momentum=1", "`aggregation.outer_momentum` must lie in the interval [0, 1). "
                                         "Received: aggregation.outer_momentum=1.0"),
        ("aggregation.outer_beta_2=1.5", "Received: aggregation.outer_beta_2=1.5"),
        ("aggregation.outer_epsilon=-1e-7", "`aggregation.outer_epsilon` must be >= 0"),
    ],
)
def test_bad_values_name_key_value_and_expectation(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [override])
    assert fragment in str(info.value)


@pytest.mark.parametrize("other", ["aggregation.ssp=1", "model.optimizer='lbfgs'"])
def test_an_outer_optimizer_without_synchronous_rounds_is_refused_naming_both_keys(other):
    key = other.split("=")[0]
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, ["aggregation.outer_optimizer='nesterov'", other])
    message = str(info.value)
    assert "`aggregation.outer_optimizer` = 'nesterov'" in message and f"with {key}=" in message
    load_config(QUICKSTART, [other])  # fine with the default, which takes no outer step there


def test_check_shows_the_outer_settings_and_refuses_a_bad_combination(capsys):
    from mpi_trainer.cli import main

    assert main(["check", QUICKSTART, "--set", "aggregation.outer_optimizer=nesterov"]) == 0
    ok = capsys.readouterr().out
    assert 'outer_optimizer = "nesterov"' in ok and "outer_learning_rate = 1.0" in ok
    assert "outer_momentum = 0.5" in ok
    assert main(["check", QUICKSTART]) == 0
    default = capsys.readouterr().out
    assert 'outer_optimizer = "auto"' in default
    assert ("outer optimizer nesterov (learning rate 1, momentum 0.5), chosen by aggregation.outer_optimizer = "
            '"auto" (none with one worker)') in default
    assert main(["check", QUICKSTART, "--set", "aggregation.outer_optimizer=adam", "--set", "aggregation.ssp=2"]) != 0
    bad = capsys.readouterr().err
    assert "aggregation.ssp=2" in bad and "aggregation.outer_optimizer" in bad


def test_check_refuses_what_the_fit_would_refuse_naming_it(capsys):
    from mpi_trainer.cli import main

    assert main(["check", QUICKSTART, "--set", "aggregation.ssp=1", "--set", "aggregation.wire_dtype=float16"]) != 0
    assert "cannot be combined with aggregation.wire_dtype='float16'" in capsys.readouterr().err
    assert main(["check", QUICKSTART, "--set", "train.overlap_eval=true", "--set", "aggregation.ssp=1"]) != 0
    assert "train.overlap_eval=True: it hands out a synchronous round" in capsys.readouterr().err
