"""A fit of the user's keras.Model under ``mpirun -n 3`` survives what clusters do to jobs: killed after a
checkpoint, the same script resumes its run; a different fit on that run directory is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

from mpi_trainer.launch.mpirun import find_mpirun

JOB = ROOT / "tests" / "mpirun" / "keras_fit_job.py"


def run_job(run_dir, mode: str, timeout: float = 240) -> tuple[int, dict[int, dict], str]:
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    proc = subprocess.run([*command, sys.executable, str(JOB), str(run_dir), mode], cwd=ROOT,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, capture_output=True, text=True,
                          timeout=timeout)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"rank"')]
    return proc.returncode, {line["rank"]: line for line in lines}, proc.stdout + proc.stderr


def test_a_killed_fit_resumes_from_its_checkpoint_and_another_fit_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    code, results, output = run_job(run_dir, "interrupted")
    assert code != 0 and not results, output  # rank 0 ended hard after epoch 2
    assert (run_dir / "checkpoint.h5").exists()
    code, results, output = run_job(run_dir, "again")
    assert code == 0 and sorted(results) == [0, 1, 2], output
    first = results[0]
    assert first["epoch"] == [0, 1, 2, 3, 4]  # epochs 0-2 from the checkpoint, 3-4 trained now
    assert "resuming after round 2 " in (run_dir / "train.log").read_text()
    assert first["accuracy"] > 0.85
    for rank in (1, 2):
        assert results[rank]["history"] == first["history"]
        assert abs(results[rank]["accuracy"] - first["accuracy"]) < 1e-6
    for rank in (0, 1, 2):  # the recompiled model's fit: refused on every rank, naming what differs
        assert "holds the run of another fit" in results[rank]["second"], results[rank]
        assert "compile" in results[rank]["second"]
    rows = (run_dir / "rounds.csv").read_text().splitlines()
    assert len(rows) == 1 + 5  # one row per epoch, none twice
