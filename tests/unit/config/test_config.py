"""Config loading: defaults < file < --set, and every bad value named with the value received."""

from __future__ import annotations

import pytest

from mpi_trainer.config import Config, all_keys, load_config, parse_override
from mpi_trainer.errors import ConfigError

QUICKSTART = "configs/quickstart.toml"


def test_defaults_file_and_overrides_take_precedence_in_order(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nepochs = 7\nbatch_size = 16\n")
    cfg = load_config(path, ["train.epochs=3", "model.name=lenet", "aggregation.method='best'"])
    assert cfg.train.epochs == 3  # --set beats the file
    assert cfg.train.batch_size == 16  # the file beats the default
    assert cfg.train.seed == Config().train.seed  # default kept
    assert cfg.model.name == "lenet" and cfg.aggregation.method == "best"


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = load_config(QUICKSTART, ["early_stopping.patience=3"])
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    assert load_config(path) == cfg


def test_every_contract_key_exists():
    keys = set(all_keys())
    for key in ("data.source", "data.test_size", "model.name", "model.optimizer", "model.learning_rate",
                "train.epochs", "train.batch_size", "aggregation.method", "aggregation.ssp",
                "early_stopping.patience", "early_stopping.min_delta", "checkpoint.every", "train.device",
                "train.sync_every"):
        assert key in keys


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("train.batch_size=0", "`train.batch_size` must be > 0. Received: train.batch_size=0"),
        ("train.epochs=-1", "`train.epochs` must be > 0. Received: train.epochs=-1"),
        ("data.test_size=1.5", "`data.test_size` must lie in the interval [0, 1). "
                               "Received: data.test_size=1.5"),
        ("data.test_size=1", "Received: data.test_size=1.0"),
        ("aggregation.ssp=-2", "`aggregation.ssp` must be >= 0. Received: aggregation.ssp=-2"),
        ("aggregation.method='median'", "`aggregation.method` must be one of ['average', 'weighted', "
                                        "'best', 'synchronous']. Received: aggregation.method='median'"),
        ("train.device='tpu'", "`train.device` must be one of ['auto', 'cpu', 'gpu']. "
                               "Received: train.device='tpu'"),
        ("train.scheduler_device='auto'", "`train.scheduler_device` must be one of ['cpu', 'gpu']. "
                                          "Received: train.scheduler_device='auto'"),
        ("train.epochs='ten'", "`train.epochs` must be of type int. Received: train.epochs='ten'"),
        ("train.epochs=true", "`train.epochs` must be of type int. Received: train.epochs=True"),
        ("model.learning_rate='fast'", "`model.learning_rate` must be of type float"),
        ("data.source='/no/such/file.npz'", "`data.source` names a data file that does not exist. "
                                            "Received: data.source='/no/such/file.npz'"),
        ("data.source='imagenet'", "`data.source` must be one of"),
        ("log.verbosity=5", "`log.verbosity` must be 0, 1 or 2. Received: log.verbosity=5"),
        ("comm.poll_interval=-0.1", "`comm.poll_interval` must be >= 0. Received: comm.poll_interval=-0.1"),
        ("comm.poll_interval=5", "`comm.poll_interval` must be <= 1 second. Received: comm.poll_interval=5.0"),
    ],
)
def test_bad_values_name_key_value_and_expectation(override, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, [override])
    assert fragment in str(info.value)


def test_unknown_key_suggests_the_closest_known_key():
    expected = r"Unknown config key `train.epoch`\. Did you mean `train.epochs`\?"
    with pytest.raises(ConfigError, match=expected):
        load_config(QUICKSTART, ["train.epoch=5"])


def test_unknown_section_in_file_is_an_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[trian]\nepochs = 2\n")
    with pytest.raises(ConfigError, match="Unknown config key `trian`"):
        load_config(path)


def test_toml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[train]\nepochs = 3\nbatch_size = = 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message and "line 3" in message


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="Config file not found"):
        load_config(tmp_path / "absent.toml")


def test_override_values_are_toml_with_bare_string_fallback():
    assert parse_override("train.epochs=5") == ("train.epochs", 5)
    assert parse_override("model.learning_rate=1e-3") == ("model.learning_rate", 0.001)
    assert parse_override("model.name=lenet") == ("model.name", "lenet")
    assert parse_override("model.name=my.pkg:build") == ("model.name", "my.pkg:build")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("train.epochs")


def test_section_given_a_scalar_is_rejected():
    with pytest.raises(ConfigError, match="`train` must be a table of keys"):
        load_config(QUICKSTART, ["train=3"])


@pytest.mark.parametrize("override", ["aggregation.method='best'", "early_stopping.monitor='val_loss'"])
def test_a_validation_split_is_held_out_only_when_something_reads_it(override):
    assert load_config(QUICKSTART, ["data.validation_size=0"]).data.validation_size == 0.0
    assert load_config(QUICKSTART, [override, "data.validation_size=0"]).data.validation_size == 0.1
    assert load_config(QUICKSTART, [override, "data.validation_size=0.3"]).data.validation_size == 0.3
    assert load_config(QUICKSTART, ["data.validation_size=0.2"]).data.validation_size == 0.2


def test_rules_across_sections_are_applied_by_the_loader():
    with pytest.raises(ConfigError, match=r"with train.max_steps=10: it splits the last synchronous round"):
        load_config(QUICKSTART, ["aggregation.ssp=1", "train.max_steps=10"])


def test_resolving_derived_values_builds_a_new_config_and_leaves_the_loaded_one_alone():
    from mpi_trainer.config.loader import _build
    from mpi_trainer.config.rules import with_derived_values

    built = _build(Config, {"aggregation": {"method": "best"}}, "")
    resolved = with_derived_values(built)
    assert built.data.validation_size == 0.0 and resolved.data.validation_size == 0.1
    assert with_derived_values(resolved) is resolved


def test_a_regression_model_watches_test_loss_without_changing_the_config():
    from mpi_trainer.algorithms.early_stopping import EarlyStopping

    cfg = load_config(QUICKSTART)
    before = cfg.to_dict()
    early = EarlyStopping.from_config(cfg.early_stopping, ["loss", "mae"])
    assert early.monitor == "test_loss" and early.minimise
    assert cfg.to_dict() == before and cfg.early_stopping.monitor == "test_accuracy"


def test_a_monitor_the_model_does_not_compute_is_refused_with_the_available_ones():
    from mpi_trainer.algorithms.early_stopping import watched_metric

    with pytest.raises(ConfigError, match=r"Received: early_stopping.monitor='test_auc'; expected one of "
                                          r"\['test_loss', 'test_mae'\]"):
        watched_metric("test_auc", 0, ["loss", "mae"])
    assert watched_metric("val_mae", 3, ["loss", "mae"]) == "val_mae"
