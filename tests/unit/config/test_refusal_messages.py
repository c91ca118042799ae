"""Every refusal names what was received and what was expected."""

from __future__ import annotations

import pytest

from mpi_trainer.cli import main


@pytest.mark.parametrize("override, received, expected", [
    ("train.epochs", "Received: 'train.epochs'", "expects KEY=VALUE such as train.epochs=5"),
    ("data.source=missing/file.npz", "Received: data.source='missing/file.npz'", "expected an existing file"),
])
def test_check_names_what_it_received_and_what_it_expected(override, received, expected, capsys):
    assert main(["check", "configs/quickstart.toml", "--set", override]) == 2
    err = capsys.readouterr().err
    assert received in err and expected in err
