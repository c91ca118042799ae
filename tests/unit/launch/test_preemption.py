"""Preemption in one process: the signal handler and its grace timer (a preempted fit: tests/unit/trainer/
test_fit_again.py)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

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

