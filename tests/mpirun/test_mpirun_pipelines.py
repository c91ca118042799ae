"""Every input kind under ``mpirun -n 3``, in one script: a Horovod-style tf.data script left unchanged,
a keras.utils.PyDataset, each rank's own generator, a refused combination, and from the config an HDF5
file read in batches, an image folder and TFRecord files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

from mpi_trainer.launch.mpirun import find_mpirun
from tests.unit.data.test_streaming_files import digits_h5
from tests.unit.data.test_tfrecords import image_folder, tfrecord_files

JOB = ROOT / "tests" / "mpirun" / "pipeline_job.py"


def test_tf_data_py_dataset_and_generators_train_and_a_refusal_reaches_every_rank(tmp_path):
    command = [find_mpirun(), "-n", "3", "--oversubscribe", "--bind-to", "none"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    # this checkout's package first, whichever one the environment installed
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    data = tmp_path / "data"
    data.mkdir()
    digits_h5(data / "digits.h5")
    image_folder(data / "images", classes=2)
    tfrecord_files(data / "records")
    proc = subprocess.run([*command, sys.executable, str(JOB), str(tmp_path), str(data)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=420)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    jobs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"job"')]
    trained = {job["job"]: job for job in jobs if "history" in job}
    assert set(trained) == {"tf.data", "PyDataset", "generator", "hdf5", "images", "tfrecord"}, output
    for name, job in trained.items():
        # fit's validation_data is scored as val_*, as model.fit names it; a config's data.source keeps test_*
        scored = "val_accuracy" if name in ("tf.data", "PyDataset", "generator") else "test_accuracy"
        accuracy = job["history"][scored]
        assert accuracy[-1] > 0.6, (name, accuracy)  # ten classes: chance is 0.1
    assert len(trained["tf.data"]["history"]["val_accuracy"]) == 3
    log = (tmp_path / "tfdata" / "train.log").read_text()
    assert "fit: a tf.data.Dataset, in 2 shares of 10 batches an epoch" in log  # steps_per_epoch=20, two workers
    # 57 batches of 32 digits, every other one a worker's (as model.fit, nothing is held out beside validation_data)
    assert "fit: a PyDataset, in 2 shares" in (tmp_path / "pydataset" / "train.log").read_text()
    assert trained["PyDataset"]["history"]["steps"] == [57.0, 57.0]
    refused = [job["rank"] for job in jobs if job["job"] == "refused"]
    assert sorted(refused) == [0, 1, 2], output
    message = ("`data.increment.enabled` adds a draw of the other workers' rows to each worker's share every "
               "epoch: arrays given as `x`, trained in whole epochs. Received: data.increment.enabled=True with x "
               "of kind 'generator'")
    assert output.count(message) == 3, output
    # the config's sources train as a keras.Model, each worker on its share of the pipeline
    assert "fit: a file read in batches (data.stream), in 2 shares" in (tmp_path / "hdf5" / "train.log").read_text()
    assert "fit: a TFRecord source, in 2 shares" in (tmp_path / "tfrecord" / "train.log").read_text()
    assert "fit: a tf.data.Dataset, in 2 shares" in (tmp_path / "images" / "train.log").read_text()
