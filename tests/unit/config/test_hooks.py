"""Test hooks (``debug.*``): settable with --set, validated, carried by the loaded config as ``test_hooks``
beside its sections, never one of its keys, never written or shown."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mpi_trainer.cli import build_parser, main
from mpi_trainer.config import Config, all_keys, config_from_dict, load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.hooks import TestHooks
from mpi_trainer.launch.launcher import job_command
from mpi_trainer.launch.supervisor import AttemptHosts
from mpi_trainer.trainer import slowdown

QUICKSTART = "configs/quickstart.toml"
HOOKS = ["debug.slow_ranks=[2]", "debug.slow_factor=3.0", "debug.nan_rank=1"]


def test_hooks_set_with_set_ride_with_the_config_but_are_none_of_its_keys():
    cfg = load_config(QUICKSTART, HOOKS)  # accepted with --set; their effects are tested where they are used
    assert cfg.test_hooks == TestHooks(slow_ranks=[2], slow_factor=3.0, nan_rank=1)
    assert not hasattr(cfg, "debug") and "debug" not in {name for name in Config.__dataclass_fields__}
    assert not [key for key in all_keys() if key.startswith(("debug.", "test_hooks"))]
    assert "debug" not in cfg.to_dict() and "test_hooks" not in cfg.to_dict()
    assert "debug" not in cfg.to_toml() and "slow_ranks" not in cfg.to_toml() and "test_hooks" not in cfg.to_toml()
    with pytest.raises(ConfigError, match="Unknown config key `test_hooks`"):
        load_config(QUICKSTART, ["test_hooks.nan_rank=1"])


def test_launch_passes_the_hooks_to_every_attempt_s_train_line_as_they_were_typed(tmp_path):
    """Fault-injection scripts type `launch ... --set debug.batch_delay=...`: the first attempt and every
    restart (with --resume) run `train` with the same --set, so each rank installs the same hooks."""
    typed = ["--set", "debug.batch_delay=0.04", "--set", "debug.nan_rank=1", "--set", "train.epochs=2"]
    args = build_parser().parse_args(["launch", "-n", "3", QUICKSTART, *typed])
    command_for = job_command(args, AttemptHosts(3, None), tmp_path)
    for attempt in (0, 1):
        line = command_for(attempt)
        train = line[line.index("train"):]
        assert train[:2 + len(typed)] == ["train", QUICKSTART, *typed], train


def _batches(monkeypatch, cfg, rank, compute_seconds, batches=3):
    """Seconds each batch of ``rank`` takes under ``cfg``'s hooks (its compute plus the hook's pause),
    on a fake clock; None when the rank gets no slowdown at all."""
    clock = SimpleNamespace(now=0.0, pauses=[])
    fake_time = SimpleNamespace(perf_counter=lambda: clock.now,
                                sleep=lambda seconds: clock.pauses.append(seconds))
    monkeypatch.setattr(slowdown, "time", fake_time)
    callback = slowdown.make_slowdown(cfg.test_hooks, rank)
    if callback is None:
        return None
    for batch in range(batches):
        callback.on_train_batch_begin(batch)
        clock.now += compute_seconds
        callback.on_train_batch_end(batch)
    return [compute_seconds + pause for pause in clock.pauses]


def test_set_on_the_command_line_slows_the_named_ranks_by_the_factor_and_every_worker_by_the_delay(monkeypatch):
    args = build_parser().parse_args(["train", QUICKSTART, "--set", "debug.batch_delay=0.04",
                                      "--set", "debug.slow_ranks=[2]", "--set", "debug.slow_factor=3.0"])
    cfg = load_config(args.config, args.overrides)
    # the first batch (graph tracing) is never slowed; then rank 2 takes 3 x (compute + delay) per batch
    assert _batches(monkeypatch, cfg, 2, 0.01) == pytest.approx([3 * (0.01 + 0.04)] * 2)
    assert _batches(monkeypatch, cfg, 1, 0.01) == pytest.approx([0.01 + 0.04] * 2)
    assert _batches(monkeypatch, load_config(QUICKSTART, []), 2, 0.01) is None  # without hooks, no callback


def test_a_table_and_the_python_api_s_overrides_spell_them_alike():
    cfg = load_config({"debug": {"batch_delay": 0.04}}, {"debug.nan_rank": 1, "debug.nan_round": 2})
    assert cfg.test_hooks == TestHooks(batch_delay=0.04, nan_rank=1, nan_round=2)


def test_no_load_sees_the_hooks_of_another():
    hooked = load_config(QUICKSTART, HOOKS)
    assert config_from_dict({}).test_hooks == TestHooks()
    assert load_config(QUICKSTART, []).test_hooks == TestHooks()
    assert hooked.test_hooks.nan_rank == 1


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


@pytest.mark.parametrize(("setting", "message"), [
    ("debug.slow_factor=0.5", r"`debug.slow_factor` must be >= 1 .*Received: debug.slow_factor=0.5"),
    ("debug.slow_factor='x'", r"`debug.slow_factor` must be of type float. Received: debug.slow_factor='x'"),
    ("debug.nan_rank='x'", r"`debug.nan_rank` must be of type int. Received: debug.nan_rank='x'"),
    ("debug.crash_phase='later'", r"`debug.crash_phase` must be one of \['train', 'contribute'\]"),
    ("debug=3", r"`debug` must be a table of keys. Received: debug=3"),
])
def test_a_bad_hook_value_still_fails_before_training(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_config(QUICKSTART, [setting])


def test_a_hook_the_config_cannot_honour_is_refused_with_the_config():
    with pytest.raises(ConfigError, match=r"`debug.nan_rank` is not available with model.optimizer='lbfgs'"):
        load_config(QUICKSTART, ["debug.nan_rank=1", "model.optimizer='lbfgs'"])
