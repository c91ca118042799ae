"""Real ``mpirun`` jobs in which one rank stops (SIGSTOP, ``debug.freeze_rank``) or fails: every other rank
leaves within the bound, naming who and where. Small explicit bounds keep each test short; the times
measured here fill the reliability table of docs/fault-tolerance.md. The bounds must still cover a
legitimate first round (it compiles) on a busy 2-core CI machine."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import MPI_TIMEOUT, ROOT
from test_mpirun_api import run_fit

from mpi_trainer.errors import EXIT_WORKER_FAILURE
from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

QUICK = ["configs/quickstart.toml", "--set", "log.plots=false", "--set", "train.epochs=50"]
HOST = os.uname().nodename
FROZEN = "stops itself (SIGSTOP)"


def frozen_job(run_dir: Path, *sets: str) -> tuple[int, str, float]:
    """Run a job in which a rank freezes; (exit status, output, seconds from the freeze to the job's end)."""
    args = ["train", *QUICK, *(item for key in sets for item in ("--set", key)), "--run-dir", str(run_dir)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    job = subprocess.Popen(mpirun_command(3, args), cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
    lines, frozen_at, deadline = [], None, time.monotonic() + MPI_TIMEOUT
    for line in job.stdout:
        lines.append(line)
        if frozen_at is None and FROZEN in line:
            frozen_at = time.monotonic()
        assert time.monotonic() < deadline, "".join(lines)
    job.wait(timeout=30)
    output = "".join(lines)
    assert frozen_at is not None, output
    print(f"detected and ended in {time.monotonic() - frozen_at:.1f} s")  # for the reliability table
    return job.returncode, output, time.monotonic() - frozen_at


def test_a_worker_stopped_during_set_up_is_named_by_rank_0_within_the_set_up_bound(tmp_path):
    code, output, seconds = frozen_job(tmp_path / "run", "debug.freeze_rank=2", "watchdog.setup_timeout=15")
    assert code == EXIT_WORKER_FAILURE, output
    assert (f"mpi_trainer: error: rank 0 of 3 on {HOST}, set-up: no agreement of every rank within 15 s "
            f"(waiting for rank 2 on host {HOST}); ending the job") in output
    assert seconds < 15 + 20
    assert not (tmp_path / "run" / "rounds.csv").exists()


def test_an_idle_worker_stopped_under_ssp_is_named_when_its_next_update_goes_out(tmp_path):
    code, output, seconds = frozen_job(tmp_path / "run", "aggregation.ssp=2", "debug.freeze_rank=2",
                                       "debug.freeze_round=1", "watchdog.worker_timeout=10")
    assert code == EXIT_WORKER_FAILURE, output
    # rank 0 waits for the next update; the only one in flight is the stopped worker's
    assert (f"mpi_trainer: error: rank 0 of 3 on {HOST}, under SSP, waiting for the next update (in flight: rank 2 "
            f"on host {HOST}): no message (tag 33) from any rank within 10 s; ending the job") in output, output
    assert seconds < 10 + 20


def test_a_stopped_scheduler_is_named_by_the_workers_within_twice_the_bound(tmp_path):
    code, output, seconds = frozen_job(tmp_path / "run", "debug.freeze_rank=0", "debug.freeze_round=1",
                                       "watchdog.worker_timeout=10")
    assert code == EXIT_WORKER_FAILURE, output
    assert (f"waiting for the scheduler's next order (after round 1): no message broadcast by rank 0 "
            f"within 20 s (waiting for rank 0 on host {HOST}); ending the job") in output
    assert seconds < 20 + 20
    assert [int(row["round"]) for row in read_rounds(tmp_path / "run" / "rounds.csv")] == [0, 1]


@pytest.mark.parametrize("settings", [[], ["train.overlap_eval=true"]], ids=["in_turn", "overlapped"])
def test_a_failure_caught_on_rank_0_ends_fit_on_every_rank_and_the_sweep_goes_on(tmp_path, settings):
    """Overlapped, the workers are training round 2 when rank 0's callback fails after round 1."""
    code, results, output = run_fit(tmp_path / "sweep", "caught", PYTHONPATH=str(ROOT),
                                    MPI_TRAINER_SET=json.dumps(settings))
    assert code == 0, output
    failed = "RuntimeError: callback broke after round 1"
    assert results[0]["jobs"][0]["error"] == failed
    for rank in (1, 2):
        expected = f"PeerFailure: rank 0 (the scheduler) on host {HOST} failed: {failed}"
        assert results[rank]["jobs"][0]["error"] == expected
    # the workers leave within a few of their polling sleeps, not at a bound
    left = max(results[rank]["jobs"][0]["failed_at"] for rank in (1, 2)) - results[0]["jobs"][0]["failed_at"]
    print(f"the workers left fit {left:.2f} s after rank 0's failure")  # for the reliability table
    assert left < 10
    assert [results[rank]["jobs"][1]["rounds"] for rank in (0, 1, 2)] == [4, 4, 4]  # the History, on every rank
