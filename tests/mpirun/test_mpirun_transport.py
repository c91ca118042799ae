"""The transport's bulk verbs across three real MPI processes: exact, idle while waiting, bounded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from conftest import ROOT

from mpi_trainer.launch.mpirun import find_mpirun

JOB = ROOT / "tests" / "mpirun" / "transport_job.py"


def run_job(scenario: str, timeout: float = 120) -> tuple[int, list[dict], float]:
    """``mpirun -n 3 python transport_job.py SCENARIO``: exit code, JSON lines printed, seconds."""
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    started = time.perf_counter()
    proc = subprocess.run([*command, sys.executable, str(JOB), scenario], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result from the job ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, lines, time.perf_counter() - started


def test_2mb_reduce_broadcast_and_send_are_exact_at_three_ranks():
    code, (result,), _ = run_job("exact")
    assert code == 0
    assert result["rank 0"] == {"broadcast": True, "reduce": True, "send_array": True,
                                "bytes": 2 * 2_000_000}  # the broadcast's two copies
    assert result["rank 1"] == {"broadcast": True, "bytes": 2_000_000}  # its share of the reduction
    assert result["rank 2"] == {"broadcast": True, "bytes": 2 * 2_000_000}  # reduction + send_array


def test_ranks_waiting_for_a_late_rank_stay_near_idle():
    code, (result,), _ = run_job("late")
    assert code == 0
    waits = [result["rank 0"]["reduce"], result["rank 1"]["reduce"], result["rank 0"]["recv_array"]]
    for wait in waits:
        assert wait["wall"] >= 0.9, waits  # they really waited for the late rank
        assert wait["cpu"] < 0.1 * wait["wall"], waits  # a blocking MPI wait spins at up to 100 %


def test_a_rank_that_never_arrives_times_out_by_name_and_the_job_ends():
    code, lines, seconds = run_job("timeout", timeout=60)
    assert code != 0
    assert lines[0]["missing"] == [2]
    assert "no weights reduction within 1 s (waiting for rank 2)" in lines[0]["error"]
    assert seconds < 45  # rank 2 sleeps 300 s: the abort ended it
