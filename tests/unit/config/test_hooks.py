"""Test hooks (``debug.*``): settable with --set, validated, and never shown to users."""

from __future__ import annotations

import pytest

from mpi_trainer.cli import main
from mpi_trainer.config import all_keys, load_config
from mpi_trainer.errors import ConfigError

QUICKSTART = "configs/quickstart.toml"
HOOKS = ["debug.slow_ranks=[2]", "debug.slow_factor=3.0", "debug.async_engine=true", "debug.nan_rank=1"]


def test_hooks_are_settable_but_stay_out_of_the_public_keys_and_the_written_config():
    cfg = load_config(QUICKSTART, HOOKS)  # accepted with --set; their effects are tested where they are used
    assert not [key for key in all_keys() if key.startswith("debug.")]
    assert "debug.slow_ranks" in all_keys(hidden=True)
    assert "debug" not in cfg.to_dict()
    assert "debug" not in cfg.to_toml() and "slow_ranks" not in cfg.to_toml()


def test_check_does_not_print_the_hooks(capsys):
    assert main(["check", QUICKSTART, *[part for hook in HOOKS for part in ("--set", hook)]]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "debug" not in out and "slow_ranks" not in out


def test_an_unknown_public_key_is_never_hinted_towards_a_hook():
    with pytest.raises(ConfigError) as info:
        load_config(QUICKSTART, ["train.async_engine=true"])
    assert "debug" not in str(info.value)
    assert "Known keys: data.source" in str(info.value)


def test_a_misspelt_hook_is_hinted_among_the_hooks_only():
    with pytest.raises(ConfigError, match=r"Did you mean `debug.slow_ranks`\?") as info:
        load_config(QUICKSTART, ["debug.slow_rank=[2]"])
    assert "train.epochs" not in str(info.value)


def test_a_bad_hook_value_still_fails_before_training():
    with pytest.raises(ConfigError, match=r"`debug.slow_factor` must be >= 1 .*Received: debug.slow_factor=0.5"):
        load_config(QUICKSTART, ["debug.slow_factor=0.5"])
