"""The [lbfgs] section and what full-batch L-BFGS refuses, before any rank starts."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import fmin_l_bfgs_b, minimize, rosen, rosen_der

from mpi_trainer.config import ConfigError, config_from_dict, load_config
from mpi_trainer.trainer.check import check
from mpi_trainer.trainer.lbfgs import settings_from

ROOT = Path(__file__).resolve().parents[3]
LBFGS = {"model": {"name": "softmax_regression", "optimizer": "lbfgs"}}


def lbfgs_config(**sections: dict) -> object:
    return config_from_dict({**LBFGS, **sections})


def test_defaults_are_scipys_own():
    """A user who knows ``fmin_l_bfgs_b`` gets its stopping rules unless the config says otherwise."""
    scipy = {name: parameter.default for name, parameter in inspect.signature(fmin_l_bfgs_b).parameters.items()}
    cfg = lbfgs_config().lbfgs
    assert cfg.history_size == scipy["m"]
    assert cfg.gtol == scipy["pgtol"]
    assert cfg.ftol == pytest.approx(scipy["factr"] * np.finfo(float).eps)  # SciPy: ftol = factr * eps
    assert cfg.max_evaluations == scipy["maxfun"]


def test_the_options_a_default_config_hands_scipy_run_scipys_own_l_bfgs_b():
    """The engine calls ``scipy.optimize.minimize(method="L-BFGS-B", options=...)``: with the config's
    defaults it takes the same iterates and stops at the same point as a call with no options at all."""
    options = settings_from(lbfgs_config(), iterations=15000).scipy_options()
    del options["maxiter"]  # the iteration limit is train.epochs, not one of L-BFGS's own defaults
    start = np.array([-1.2, 1.0, -0.5, 0.8, 1.5])
    ours = minimize(rosen, start, jac=rosen_der, method="L-BFGS-B", options=options)
    scipys = minimize(rosen, start, jac=rosen_der, method="L-BFGS-B")
    assert (ours.nit, ours.nfev, ours.message) == (scipys.nit, scipys.nfev, scipys.message)
    np.testing.assert_array_equal(ours.x, scipys.x)
    fewer = minimize(rosen, start, jac=rosen_der, method="L-BFGS-B", options={**options, "maxcor": 3})
    assert (fewer.nit, fewer.nfev) != (scipys.nit, scipys.nfev)  # the comparison can tell options apart


@pytest.mark.parametrize("key, value, expected", [
    ("history_size", 0, "must be > 0"), ("max_evaluations", 0, "must be > 0"), ("batch_size", -1, "must be > 0"),
    ("gtol", -1.0, "must be >= 0"), ("ftol", -0.5, "must be >= 0"),
])
def test_bad_lbfgs_values_name_the_key(key, value, expected):
    with pytest.raises(ConfigError, match=rf"`lbfgs.{key}` {expected}. Received: lbfgs.{key}={value}"):
        lbfgs_config(lbfgs={key: value})


@pytest.mark.parametrize("section, key, value", [
    ("aggregation", "ssp", 1), ("aggregation", "method", "best"), ("data", "rebalance", True),
    ("train", "max_steps", 5), ("train", "overlap_eval", True), ("train", "nan_policy", "rollback"),
    ("debug", "nan_rank", 1),
])
def test_what_lbfgs_cannot_honour_is_refused(section, key, value):
    with pytest.raises(ConfigError, match=rf"`{section}.{key}` is not available with model.optimizer='lbfgs'.*"
                                          rf"Received: {section}.{key}={value!r} with model.optimizer='lbfgs'"):
        lbfgs_config(**{section: {key: value}})


@pytest.mark.parametrize("nested", ["increment", "augmentation"])
def test_data_that_changes_between_evaluations_is_refused(nested):
    with pytest.raises(ConfigError, match=rf"`data.{nested}.enabled` is not available.*objective must not change"):
        lbfgs_config(data={nested: {"enabled": True}})


def test_the_same_settings_pass_with_a_keras_optimizer():
    cfg = config_from_dict({"aggregation": {"ssp": 1}, "model": {"optimizer": "adam"}})
    assert cfg.aggregation.ssp == 1


@pytest.mark.parametrize("name", ["digits_lbfgs.toml", "mnist_softmax_lbfgs.toml"])
def test_shipped_configs_load(name):
    cfg = load_config(str(ROOT / "configs" / name), [])
    assert cfg.model.optimizer == "lbfgs" and cfg.model.name == "softmax_regression"


def test_check_builds_the_model_and_its_gradient():
    cfg = load_config(str(ROOT / "configs" / "digits_lbfgs.toml"), [])
    assert "softmax_regression with 650 parameters" in check(cfg, workers=2)
