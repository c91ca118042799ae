"""Preemption in one process: the signal handler, its grace timer, and a run that stops after a round."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from local_job import run_local_job

from mpi_trainer.persistence.checkpoint import load_checkpoint
from mpi_trainer.persistence.preemption import Preemption


@pytest.fixture
def watch():
    state = Preemption()
    yield state
    state.uninstall()


def test_the_signal_is_noted_and_the_grace_timer_ends_the_job(watch):
    expired = threading.Event()
    before = signal.getsignal(signal.SIGUSR1)
    watch.install(["SIGUSR1"], 0.2, expired.set)
    assert not watch.requested
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 5
    while not watch.requested and time.monotonic() < deadline:
        time.sleep(0.01)
    assert watch.signal_name == "SIGUSR1"
    assert expired.wait(5), "the grace period ran out without ending the job"
    watch.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == before and not watch.requested


def test_a_preempted_run_checkpoints_the_round_under_way_and_is_not_complete(tmp_path, watch):
    import keras

    # the signal arrives while round 1 closes
    signal_cb = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs=None: epoch == 1 and watch.request("SIGTERM"))
    job = run_local_job(tmp_path, workers=2, callbacks=[signal_cb], preemption=watch,
                        train={"epochs": 5, "batch_size": 64}, checkpoint={"every_seconds": 0})
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stop_reason"] == "preempted" and summary["completed"] is False
    assert [int(r["round"]) for r in job.rounds()] == [0, 1]
    _, meta = load_checkpoint(tmp_path / "checkpoint.h5")
    assert meta["round"] == 1  # the round under way when the signal came
    assert not (tmp_path / "final.weights.h5").exists()
