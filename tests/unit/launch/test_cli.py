"""The command line, in-process: `check` validates without MPI and exits non-zero on bad input."""

from __future__ import annotations

from mpi_trainer.cli import main


def test_check_accepts_the_quickstart_config_and_prints_it_resolved(capsys):
    assert main(["check", "configs/quickstart.toml", "--set", "train.epochs=3", "--workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "configs/quickstart.toml: OK: digits:" in out and "model mlp with 17226 parameters" in out
    assert "epochs = 3" in out


def test_check_rejects_a_bad_value_with_exit_code_2(capsys):
    assert main(["check", "configs/quickstart.toml", "--set", "aggregation.method=median"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mpi_trainer: error: `aggregation.method` must be one of")
    assert "Received: aggregation.method='median'" in err


def test_check_builds_the_model_and_names_a_bad_optimizer(capsys):
    assert main(["check", "configs/quickstart.toml", "--set", "model.optimizer=adamx"]) == 2
    assert "Received: model.optimizer='adamx'" in capsys.readouterr().err


def test_check_finds_too_few_samples_for_the_workers(capsys):
    assert main(["check", "configs/iris_softmax.toml", "--workers", "500"]) == 2
    assert "samples for 500 workers" in capsys.readouterr().err
