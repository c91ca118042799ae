"""``mpi_trainer preflight`` under real mpirun: a table on success, a named rank and a failure otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, run_mpi

from mpi_trainer.launch.mpirun import find_mpirun


def test_preflight_prints_every_rank_and_passes():
    result = run_mpi(2, ["preflight", "configs/quickstart.toml", "--probe-mb", "1"], timeout=120)
    assert result.returncode == 0, result.output
    lines = result.output.splitlines()
    rows = [line.split() for line in lines if line.strip().split(" ")[0] in ("0", "1")]
    assert [row[0] for row in rows] == ["0", "1"]
    assert all(row[3] == "1/1" and row[4] == "ok" for row in rows), result.output
    assert "digits: " in result.output and "MB/s)" in rows[1]
    assert "preflight: OK: 2 ranks on 1 host(s)" in result.output


def test_preflight_names_the_rank_that_cannot_read_the_data(tmp_path):
    # Two app contexts: the worker gets a data path that does not exist, as on a node without
    # the shared filesystem.
    app = [sys.executable, "-m", "mpi_trainer", "preflight", "configs/quickstart.toml", "--timeout", "20"]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    command = [find_mpirun(), "--oversubscribe", *root, "-n", "1", *app, ":", "-n", "1", *app,
               "--set", f"data.source='{tmp_path / 'missing.npz'}'"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "preflight: FAILED: rank(s) 1 failed" in output
    worker_line = next(line for line in output.splitlines() if line.strip().startswith("1 "))
    assert "cannot read" in worker_line and "missing.npz" in worker_line
