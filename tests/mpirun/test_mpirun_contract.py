"""The MPI transport keeps the transport contract, as the in-process one does (tests/unit/comm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT
from transport_contract import expected

from mpi_trainer.launch.mpirun import find_mpirun

JOB = ROOT / "tests" / "mpirun" / "contract_job.py"


def test_every_verb_gives_what_the_contract_expects_over_real_mpi():
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    proc = subprocess.run([*command, sys.executable, str(JOB)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"no result ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    result = lines[0]
    seen = [{key: [tuple(item) for item in value] if key == "reports" else value for key, value in rank.items()}
            for rank in result["seen"]]
    assert seen == [expected(rank, result["size"]) for rank in range(result["size"])]
