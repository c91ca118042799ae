"""A Keras script's policies set from ``launch``'s command line, the script unedited: real processes where the
policy is about processes (a worker killed under ``fault.survive``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MPI_TIMEOUT, ROOT, MpiResult

# The ranks' TCP traffic (fault-tolerant MPI runs over TCP) stays on the loopback: the simulated hosts other
# tests create and remove meanwhile must not be taken for a path between these ranks.
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "OMPI_MCA_btl_tcp_if_include": "lo",
       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def launch(run_dir, *settings: str) -> tuple[int, str, dict[int, dict]]:
    """``launch -n 3 --set ... -- python policy_fit_job.py``: its exit code, output and each rank's line."""
    sets = [arg for setting in settings for arg in ("--set", setting)]
    command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", "--max-restarts", "0", "--run-dir",
               str(run_dir), *sets, "--", sys.executable, "tests/mpirun/policy_fit_job.py"]
    proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=MPI_TIMEOUT)
    output = proc.stdout + proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')]
    return proc.returncode, output, {line["rank"]: line for line in lines}


def test_a_script_set_to_survive_from_the_command_line_loses_a_worker_and_finishes(tmp_path):
    code, output, ranks = launch(tmp_path / "run", "fault.survive=true", "debug.crash_rank=2",
                                 "debug.crash_round=1")
    assert code == 0, output[-4000:]
    assert sorted(ranks) == [0, 1], output[-4000:]  # rank 2 was killed in epoch 1
    assert ranks[0]["history"] == ranks[1]["history"] and ranks[0]["weights"] == ranks[1]["weights"]
    assert len(ranks[0]["history"]["val_accuracy"]) == 4 and ranks[0]["history"]["val_accuracy"][-1] > 0.85
    summary = MpiResult(0, "", tmp_path / "run").summary()
    assert [lost["rank"] for lost in summary["lost_workers"]] == [2] and summary["workers"] == 1
    assert [int(row["workers"]) for row in MpiResult(0, "", tmp_path / "run").rounds()] == [2, 1, 1, 1]


def test_a_script_set_to_overlap_its_scoring_trains_on_while_rank_0_scores_and_ends_alike(tmp_path):
    code, output, ranks = launch(tmp_path / "run", "train.overlap_eval=true")
    assert code == 0, output[-4000:]
    assert sorted(ranks) == [0, 1, 2], output[-4000:]
    assert ranks[0]["history"] == ranks[1]["history"] == ranks[2]["history"]
    assert ranks[0]["weights"] == ranks[1]["weights"] == ranks[2]["weights"]
    assert len(ranks[0]["history"]["val_accuracy"]) == 4 and ranks[0]["history"]["val_accuracy"][-1] > 0.85
    assert "train.overlap_eval: rank 0 scores each epoch while the workers train the next" in output
