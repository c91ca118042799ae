"""``fault.survive`` across two simulated hosts: every rank of one host is killed mid-run, the job carries on.

Skips only where namespaces cannot be created (no root or no iproute2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from conftest import ROOT, wait_for_rounds
from simulated_hosts import simulated_hosts

from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS, mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

EPOCHS = 8


def rank_pids(host: str) -> list[int]:
    """The training processes (not Open MPI's daemon) in ``host``'s network namespace."""
    listed = subprocess.run(["ip", "netns", "pids", host], capture_output=True, text=True, check=True).stdout
    found = []
    for pid in map(int, listed.split()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if Path(argv[0].decode()).name.startswith("python") and b"mpi_trainer" in argv:
            found.append(pid)
    return found


def test_losing_every_rank_of_a_host_leaves_the_other_hosts_worker_to_finish(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "configs/quickstart.toml", "--set", f"train.epochs={EPOCHS}", "--set", "fault.survive=true",
            "--set", "log.plots=false", "--set", "log.tensorboard=false", "--run-dir", str(run_dir)]
    with simulated_hosts(2, "--slots", "2,2") as hosts:
        command = mpirun_command(4, args, None, [*hosts.mpirun_args, *FAULT_TOLERANT_OPTIONS])
        proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for_rounds(run_dir, 2, proc)
            lost_host = hosts.names[1]  # ranks 2 and 3; rank 0 and worker 1 live on the first host
            victims = rank_pids(lost_host)
            assert len(victims) == 2, victims
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            output, _ = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, output[-4000:]
    rows = read_rounds(run_dir / "rounds.csv")
    assert [int(r["round"]) for r in rows] == list(range(EPOCHS))  # every round once, none lost or repeated
    workers = [int(r["workers"]) for r in rows]
    assert workers[:2] == [3, 3] and workers[-1] == 1 and workers == sorted(workers, reverse=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sorted(lost["rank"] for lost in summary["lost_workers"]) == [2, 3]
    assert {lost["host"] for lost in summary["lost_workers"]} == {lost_host}
    assert summary.get("restarts") is None and summary["completed"] is True
