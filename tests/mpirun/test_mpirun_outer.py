"""The outer optimizer under real ``mpirun``: Nesterov trains, costs no extra bytes and is checkpointed."""

from __future__ import annotations

import h5py
from conftest import run_mpi

ROUNDS = ["--set", "train.epochs=4", "--set", "checkpoint.every=2"]


def test_nesterov_by_default_trains_and_sends_what_plain_averaging_sends_each_round(tmp_path):
    plain = run_mpi(3, ["train", "configs/quickstart.toml", *ROUNDS, "--set", "aggregation.outer_optimizer=none"],
                    tmp_path / "none")
    outer = run_mpi(3, ["train", "configs/quickstart.toml", *ROUNDS], tmp_path / "nesterov")  # "auto": Nesterov
    assert plain.returncode == 0, plain.output
    assert outer.returncode == 0, outer.output
    summary = outer.summary()
    assert summary["outer_optimizer"] == "nesterov" and summary["rounds_completed"] == 4
    accuracies = [float(r["test_accuracy"]) for r in outer.rounds()]
    assert accuracies[-1] > accuracies[0] and accuracies[-1] > 0.85, accuracies
    # the outer step runs on the scheduler: each round moves the same transfers as plain averaging
    for ours, theirs in zip(outer.rounds(), plain.rounds(), strict=True):
        assert abs(int(ours["bytes"]) - int(theirs["bytes"])) < 64, (ours["bytes"], theirs["bytes"])
    with h5py.File(tmp_path / "nesterov" / "checkpoint.h5", "r") as checkpoint:
        assert checkpoint["outer_velocity"].shape == checkpoint["weights"].shape
    log = (tmp_path / "nesterov" / "train.log").read_text()
    assert "outer optimizer nesterov (learning rate 1, momentum 0.5)" in log
