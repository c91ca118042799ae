"""The MPI transport keeps the transport contract, as the in-process one does (tests/unit/comm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from transport_contract import expected

from mpi_trainer.launch.mpirun import find_mpirun

JOB = ROOT / "tests" / "mpirun" / "contract_job.py"


@pytest.fixture(scope="module", params=["1", "0"], ids=["shared memory", "MPI's collectives"])
def contract(request) -> dict:
    """The contract job's result: every rank's exchanges and its cost of a large sum-reduction, through the
    node's shared memory and through MPI's collectives (as under ``fault.survive``)."""
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    command += ["-x", f"MPI_TRAINER_SHARED_MEMORY={request.param}"]
    proc = subprocess.run([*command, sys.executable, str(JOB)], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"no result ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return lines[0]


def test_every_verb_gives_what_the_contract_expects_over_real_mpi(contract):
    result = contract
    seen = [{key: [tuple(item) for item in value] if key == "reports" else value for key, value in rank.items()}
            for rank in result["seen"]]
    assert seen == [expected(rank, result["size"]) for rank in range(result["size"])]


def test_a_large_sum_reduction_holds_no_copy_of_the_model_on_any_rank(contract):
    # 64 MB summed at 3 ranks: in parts, no rank's peak grows by more than a few parts
    assert all(rank["exact"] for rank in contract["reduction"]), contract["reduction"]
    assert max(rank["peak_grown_mb"] for rank in contract["reduction"]) < 16, contract["reduction"]
