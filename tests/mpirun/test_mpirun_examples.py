"""The scripts in examples/ run under ``mpirun -n 3`` as a user runs them, at a tiny scale."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

from mpi_trainer.launch.mpirun import find_mpirun


def run_example(name: str, args: list[str], cwd) -> str:
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])  # this checkout's package first
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    proc = subprocess.run([*command, sys.executable, str(ROOT / "examples" / name), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return output


def test_the_examples_train_under_mpirun(tmp_path):
    # Horovod's Keras MNIST, ported: an unbuilt Sequential, ModelCheckpoint on rank 0, History on every rank
    output = run_example("horovod_keras_mnist.py", ["--epochs", "2", "--checkpoint-dir", str(tmp_path)], tmp_path)
    losses = [float(v) for v in re.findall(r"rank-local check: final training loss (\S+)", output)]
    assert len(losses) == 3 and len(set(losses)) == 1, output  # the same History on every rank
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*.weights.h5")) == [
        "checkpoint-1.weights.h5", "checkpoint-2.weights.h5"]
    # dict inputs, validation_split and class_weight
    output = run_example("structured_data_classification.py", ["--epochs", "4"], tmp_path)
    recall = re.search(r"held-out rows: accuracy (\S+), recall (\S+)", output)
    assert recall and float(recall.group(1)) > 0.85 and float(recall.group(2)) > 0.8, output


def test_the_multi_output_example_trains_under_mpirun(tmp_path):
    # a functional model with two heads: y as a dict per output, each scored under its Keras name
    output = run_example("multi_output.py", ["--epochs", "3"], tmp_path)
    keys = re.findall(r"rank \d: history keys (.+)", output)
    assert len(keys) == 3 and len(set(keys)) == 1 and "'val_even_auc'" in keys[0], output
    held_out = re.search(r"held-out images: digit accuracy ([\d.]+), even accuracy ([\d.]+)", output)
    assert held_out and float(held_out.group(1)) > 0.8 and float(held_out.group(2)) > 0.75, output
