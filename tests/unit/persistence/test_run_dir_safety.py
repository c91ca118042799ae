"""One writer per run directory, the run's fingerprint, and writes that never leave half a file."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_trainer.launch.run_dir import default_run_dir
from mpi_trainer.persistence.run_lock import RunDirBusy, RunLock, holder_id
from mpi_trainer.persistence.run_state import (
    more_to_train,
)


def test_a_second_holder_is_refused_naming_the_first_ones_host_and_pid(tmp_path):
    first = RunLock(tmp_path / "run").acquire()
    with pytest.raises(RunDirBusy, match=rf"host {socket.gethostname()} pid {os.getpid()} .*holds .*run.lock"):
        RunLock(tmp_path / "run").acquire()
    # the launcher holding the lock lets its own job's rank 0 through
    assert not RunLock(tmp_path / "run").acquire(allowed_holder=holder_id()).held
    with pytest.raises(RunDirBusy):
        RunLock(tmp_path / "run").acquire(allowed_holder="otherhost:1")
    first.release()
    assert RunLock(tmp_path / "run").acquire().held


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path):
    code = ("import sys, time\nfrom mpi_trainer.persistence.run_lock import RunLock\n"
            f"RunLock({str(tmp_path)!r}).acquire()\nprint('held', flush=True)\ntime.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
        RunLock(tmp_path).acquire()
    holder.kill()
    holder.wait()
    assert RunLock(tmp_path).acquire().held  # the kernel dropped the lock; only the note was stale
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()


def test_default_run_directories_differ_within_a_second_and_follow_a_slurm_job(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    names = {default_run_dir("configs/quickstart.toml") for _ in range(20)}
    assert len(names) == 20 and all(n.name.startswith("quickstart-") for n in names)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert default_run_dir("configs/quickstart.toml") == Path("runs/quickstart-slurm4242")


class _Data:
    def __init__(self, labels: np.ndarray) -> None:
        self.num_train, self.y_train = len(labels) - 4, labels[:-4]
        self.y_val, self.y_test = labels[-4:-2], labels[-2:]


@pytest.mark.parametrize(("summary", "epochs", "max_steps", "more"), [
    ({"stop_reason": "epochs", "rounds_completed": 4, "steps": 40}, 4, 0, False),
    ({"stop_reason": "epochs", "rounds_completed": 4, "steps": 40}, 6, 0, True),
    ({"stop_reason": "max_steps", "rounds_completed": 4, "steps": 40}, 9, 40, False),
    ({"stop_reason": "max_steps", "rounds_completed": 4, "steps": 40}, 9, 80, True),
    ({"stop_reason": "early_stopping", "rounds_completed": 3, "steps": 30}, 50, 0, False),
    ({"stop_reason": "callback", "rounds_completed": 3, "steps": 30}, 50, 0, False),
])
def test_a_complete_run_goes_on_only_past_the_limit_it_stopped_at(summary, epochs, max_steps, more):
    assert more_to_train(summary, epochs, max_steps) is more


class _FailingModel:
    def save_weights(self, path: Path) -> None:
        Path(path).write_bytes(b"half")
        raise OSError("disk full")


class _Model:
    def save_weights(self, path: Path) -> None:
        assert str(path).endswith(".weights.h5")  # Keras' own rule
        Path(path).write_bytes(b"new weights")


