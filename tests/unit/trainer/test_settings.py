"""Every config key either takes effect on a fit of a keras.Model or is refused before training, named
with its value: walked over the whole config, so a key added to the schema must be classified."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import pytest

from mpi_trainer.config import Config, all_keys, load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.trainer.fit import check_config
from mpi_trainer.trainer.settings import AS_DONE, HONOURED, NOT_APPLIED, given_keys, value_of


def leaves(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``Config.to_dict()`` as dotted keys and their values."""
    found: dict[str, Any] = {}
    for name, value in table.items():
        found.update(leaves(value, f"{prefix}{name}.") if isinstance(value, dict) else {f"{prefix}{name}": value})
    return found


DEFAULTS = leaves(load_config({}).to_dict())


def hint(key: str) -> Any:
    """The type the schema gives ``key``."""
    owner: Any = Config
    for part in key.split("."):
        owner = typing.get_type_hints(owner)[part]
    return owner


def special(csv: str) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Valid other values of keys the types do not give one for: (value, the keys it needs set with it)."""
    return {
        "data.source": ("iris", {}),
        "data.label": ("label", {"data.source": csv}),
        "data.features": (["a"], {"data.source": csv}),
        "data.datasets": (["x", "y"], {}),
        "data.stream": (False, {}),
        "data.image_size": ([128, 128], {}),
        "data.feature_shape": ([8, 8, 1], {}),
        "model.name": ("lenet", {}),
        "model.optimizer": ("sgd", {}),
        "model.loss": ("mse", {}),
        "model.metrics": (["mae"], {}),
        "early_stopping.monitor": ("test_loss", {}),
        "checkpoint.preempt_signals": (["SIGTERM"], {}),
        "train.sync_every": (1, {}),
        "train.sync_warmup_every": (2, {"train.sync_warmup_epochs": 1}),
        "aggregation.staleness_damping": (True, {"aggregation.ssp": 1}),
    }


def other_value(key: str, default: Any) -> Any:
    """A valid value other than the default, from the key's type: a bool flipped, an int + 1, another choice."""
    kind = hint(key)
    if typing.get_origin(kind) is typing.Literal:
        return next(choice for choice in typing.get_args(kind) if choice != default)
    if kind is bool:
        return not default
    if kind is int:
        return default + 1
    if kind is float:
        return default + 0.1 if default + 0.1 < 1 else default / 2
    raise AssertionError(f"no other value for `{key}` ({kind}): add one to special() in this test")


@pytest.fixture(scope="module")
def csv(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("data") / "rows.csv"
    path.write_text("a,label\n1,0\n2,1\n")
    return str(path)


def refused(overrides: dict[str, Any], run_dir: Path | None = None, given: bool = True) -> str | None:
    """check_config's refusal of ``overrides`` (as a script's fit would pass them), or None."""
    try:
        check_config(load_config({}, overrides), run_dir, False, given_keys(None, overrides) if given else ())
    except ConfigError as exc:
        return str(exc)
    return None


def test_every_key_is_classified_once():
    keys = set(all_keys())
    assert set(DEFAULTS) == keys
    assert not set(HONOURED) & set(NOT_APPLIED)
    assert set(HONOURED) | set(NOT_APPLIED) == keys, "classify each new key in mpi_trainer/trainer/settings.py"
    assert set(AS_DONE) <= set(NOT_APPLIED)


def test_the_defaults_compared_against_are_the_loaded_ones():
    assert Config().to_dict() == load_config({}).to_dict()


@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_every_key_set_away_from_its_default_takes_effect_or_is_refused_naming_it(key, csv, tmp_path):
    default = DEFAULTS[key]
    value, needs = special(csv).get(key, (None, {}))
    value = other_value(key, default) if key not in special(csv) else value
    assert value != default
    overrides = {**needs, key: value}
    if key in HONOURED:
        assert refused(overrides, tmp_path) is None
    elif key in AS_DONE and value == AS_DONE[key]:  # says what this path does: taken; the default set is not
        assert refused(overrides, tmp_path) is None
        assert f"Received: {key}={default!r}; expected {value!r}" in refused({key: default}, tmp_path)
    else:
        message = refused(overrides, tmp_path, given=False)  # told apart from the default by its value alone
        assert message is not None and f"`{key}` is not applied when `model` is a keras.Model" in message
        assert f"Received: {key}={value_of(load_config({}, overrides), key)!r}; expected" in message


@pytest.mark.parametrize("key", sorted(set(NOT_APPLIED) - set(AS_DONE)))
def test_a_key_this_path_does_not_read_is_refused_when_set_even_to_its_default(key, tmp_path):
    message = refused({key: DEFAULTS[key]}, tmp_path)
    assert message is not None and f"Received: {key}={DEFAULTS[key]!r}; expected the key left out" in message


@pytest.mark.parametrize("key", sorted(AS_DONE))
def test_a_value_that_says_what_this_path_does_is_taken(key, tmp_path):
    assert refused({key: AS_DONE[key]}, tmp_path) is None


def test_max_steps_and_tensorboard_are_taken_and_tensorboard_without_a_run_directory_is_refused(tmp_path):
    assert refused({"train.max_steps": 5, "log.tensorboard": True}, tmp_path) is None
    message = refused({"log.tensorboard": True})
    assert message is not None and "`log.tensorboard` writes into the run directory, and this fit has none" in message
    assert "Received: log.tensorboard=True with run_dir=None" in message and "or log.tensorboard=false" in message
    assert refused({}) is None  # its default, left out: nothing is written without a run directory


def test_a_key_this_path_does_not_apply_says_what_to_set_instead():
    message = refused({"data.placement": "scatter"})
    assert message is not None and "applies to models given by name or as a function" in message


@pytest.mark.parametrize("overrides", [
    {"log.plots": False, "log.tensorboard": False},  # what the repository's keras.Model jobs pass
    {"checkpoint.every": 1},
    {"aggregation.outer_optimizer": "none", "log.verbosity": 0},
    {"train.threads": 2, "train.device": "cpu", "watchdog.worker_timeout": 30.0, "comm.poll_interval": 0.01},
    {"train.epochs": 3, "train.batch_size": 16, "aggregation.method": "weighted"},
    {"train.overlap_eval": True},
])
def test_what_this_path_applies_is_taken(overrides, tmp_path):
    assert refused(overrides, tmp_path) is None


def test_best_of_election_is_taken_and_its_validation_split_is_not_blamed(tmp_path):
    assert refused({"aggregation.method": "best"}, tmp_path) is None  # the loader filled data.validation_size in


def test_every_refusal_is_named_at_once():
    message = refused({"model.learning_rate": 0.01, "data.source": "iris", "train.shuffle": False})
    assert message is not None
    for key in ("model.learning_rate", "data.source", "train.shuffle"):
        assert f"Received: {key}=" in message
    assert "data.validation_size" not in message  # filled in for the val_* monitor


def test_checkpoints_without_a_run_directory_are_refused(monkeypatch):
    monkeypatch.delenv("MPI_TRAINER_RUN_DIR", raising=False)
    message = refused({"checkpoint.every": 2})
    assert message is not None and "Received: checkpoint.every=2 with run_dir=None" in message
    assert refused({"checkpoint.every": 0}) is None
    monkeypatch.setenv("MPI_TRAINER_RUN_DIR", "runs/launched")
    assert refused({"checkpoint.every": 2}) is None


def test_given_keys_are_read_from_the_config_and_the_overrides(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text("[train]\nmax_steps = 5\n[debug]\nnan_rank = 1\n")
    assert given_keys(str(toml), None) == {"train.max_steps"}
    assert given_keys({"log": {"plots": False}, "debug": {"nan_rank": 1}},
                      ["train.epochs=3", ("data", {"increment": {"enabled": True}}), ("debug.batch_delay", 0.1)]) \
        == {"log.plots", "train.epochs", "data.increment.enabled"}
    assert given_keys(None, {"log.tensorboard": True}) == {"log.tensorboard"}


@pytest.mark.parametrize("entry", ["command line", "function or zoo name"])
@pytest.mark.parametrize("key", sorted(DEFAULTS))
def test_on_the_other_entries_every_key_is_applied_by_them_or_the_fit_or_refused_naming_it(key, entry, csv):
    """``train CONFIG`` and ``fit(build_fn, x, y)`` apply the model's (and the command line the data's) keys
    themselves; every other key is the fit's or refused, as for a script's keras.Model."""
    from mpi_trainer.trainer.config_fit import APPLIED, BUILT_APPLIED
    from mpi_trainer.trainer.settings import refusals

    applied = APPLIED if entry == "command line" else BUILT_APPLIED
    default = DEFAULTS[key]
    value, needs = special(csv).get(key, (None, {}))
    value = other_value(key, default) if key not in special(csv) else value
    table: dict[str, Any] = {}
    for name, setting in {**needs, key: value}.items():
        section, _, rest = name.partition(".")
        place = table.setdefault(section, {})
        for part in rest.split(".")[:-1]:
            place = place.setdefault(part, {})
        place[rest.split(".")[-1]] = setting
    cfg = load_config(table)
    found = [message for message in refusals(cfg, applied=applied) if f"`{key}`" in message]
    if key in HONOURED or key in applied or (key in AS_DONE and value == AS_DONE[key]):
        assert found == []
    else:
        assert found and f"Received: {key}={value_of(cfg, key)!r}" in found[0]
