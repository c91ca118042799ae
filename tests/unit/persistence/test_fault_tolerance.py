"""Fault tolerance without MPI: config keys, resume state, atomic checkpoints, NaN guard, step budgets."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpi_trainer.algorithms import nan_guard
from mpi_trainer.cli import main
from mpi_trainer.config import load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.persistence.checkpoint import load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("override, message", [
    ("train.nan_policy=ignore", "`train.nan_policy` must be one of ['stop', 'rollback']. "
                                "Received: train.nan_policy='ignore'"),
    ("train.max_steps=-1", "`train.max_steps` must be >= 0. Received: train.max_steps=-1"),
    ("watchdog.worker_timeout=-5", "`watchdog.worker_timeout` must be >= 0. "
                                   "Received: watchdog.worker_timeout=-5.0"),
    ("watchdog.stall_seconds=-1", "`watchdog.stall_seconds` must be >= 0. "
                                  "Received: watchdog.stall_seconds=-1.0"),
    ("debug.nan_rank=-2", "`debug.nan_rank` must be >= 0. Received: debug.nan_rank=-2"),
])
def test_bad_fault_tolerance_keys_are_refused_with_key_and_value(override, message, capsys):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert message in str(error.value)
    assert main(["check", "configs/quickstart.toml", "--set", override]) == 2
    assert message in capsys.readouterr().err


def _save_run_checkpoint(run_dir: Path, round_index: int, config: dict, weights: np.ndarray) -> None:
    meta = {"round": round_index, "best_value": 0.9, "best_round": round_index, "wait": 1, "steps": 40,
            "lr_scale": 0.5, "wall_seconds": 12.5, "traffic_bytes": 1000, "config": config,
            "block_bounds": [[0, 5], [5, 10], [10, 15]], "rollbacks": [{"round": 1}]}
    arrays = {"weights": weights, "best_weights": weights * 2, "optimizer_rank_1": np.ones(3, np.float32)}
    save_checkpoint(run_dir / "checkpoint.h5", arrays, meta)


def test_torn_latest_checkpoint_falls_back_to_backup_with_warning(tmp_path, caplog):
    path = tmp_path / "checkpoint.h5"
    save_checkpoint(path, {"weights": np.full(3, 1.0, np.float32)}, {"round": 1})
    save_checkpoint(path, {"weights": np.full(3, 2.0, np.float32)}, {"round": 2})
    path.write_bytes(path.read_bytes()[:100])  # torn write of the latest
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 1 and arrays["weights"].tolist() == [1.0, 1.0, 1.0]
    assert "trying the backup" in caplog.text


WRITER = """
import sys, numpy as np
from pathlib import Path
from mpi_trainer.persistence.checkpoint import save_checkpoint
path = Path(sys.argv[1])
for index in range(10**6):
    save_checkpoint(path, {"weights": np.full(200_000, index, np.float32)}, {"round": index})
    print(index, flush=True)
"""


def test_killing_the_writer_mid_checkpoint_always_leaves_a_loadable_checkpoint(tmp_path):
    """kill -9 of the checkpoint writer at random moments, many times: the checkpoint always loads whole."""
    path, rng = tmp_path / "checkpoint.h5", random.Random(0)
    last_round, torn = -1, 0
    for _ in range(12):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                                  text=True)
        writer.stdout.readline()  # at least one checkpoint of this writer is complete
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        tmp = path.with_name(path.name + ".tmp")
        torn += tmp.exists()  # killed in the middle of a write
        tmp.unlink(missing_ok=True)
        arrays, meta = load_checkpoint(path)
        assert np.all(arrays["weights"] == meta["round"])  # weights and metadata from the same save
        last_round = meta["round"]
    print(f"{torn} of 12 kills landed mid-write")
    assert last_round >= 0 and torn > 0


def test_nan_guard_names_the_ranks_and_decides_by_policy():
    good = np.ones(3, np.float32)
    outcomes = [nan_guard.WorkerOutcome(1, 0.3, True), nan_guard.WorkerOutcome(2, math.nan, False)]
    cause = nan_guard.non_finite_cause(outcomes, good)
    assert cause == ("non-finite training loss from worker rank(s) [2]; "
                     "non-finite weights from worker rank(s) [2]")
    inf = np.array([1.0, np.inf])
    assert nan_guard.non_finite_cause(outcomes[:1], inf) == "non-finite aggregated weights"
    assert nan_guard.non_finite_cause(outcomes[:1], good) is None
    assert nan_guard.decide("stop", 0) == "stop"
    assert nan_guard.decide("rollback", 0) == "rollback"
    assert nan_guard.decide("rollback", nan_guard.MAX_CONSECUTIVE_ROLLBACKS) == "stop"




def test_step_budgets_end_exactly_on_max_steps():
    from mpi_trainer.algorithms.step_budget import step_budgets

    full = {1: 21, 2: 21, 3: 20}
    assert step_budgets(62, full) is None
    assert step_budgets(100, full) is None
    assert step_budgets(22, full) == {1: 8, 2: 7, 3: 7}
    assert step_budgets(61, full) == {1: 21, 2: 20, 3: 20}
    assert step_budgets(0, full) == {1: 0, 2: 0, 3: 0}
    assert step_budgets(42, {1: 40, 2: 3}) == {1: 39, 2: 3}
