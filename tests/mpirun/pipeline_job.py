"""Run by test_mpirun_pipelines.py under ``mpirun -n 3``: one script, several inputs, as users write them.

    python tests/mpirun/pipeline_job.py RUN_DIR DATA_DIR

First a Horovod-style script: the tf.data pipeline of Horovod's Keras MNIST example, unchanged
(``repeat().shuffle().batch()``, a model built and compiled in the script, ``steps_per_epoch``),
on the digits. Then a ``keras.utils.PyDataset`` and a generator (each rank's own), then a generator
on the scheduler with a ``data.increment`` config, which every rank refuses. Last, sources from the
config that DATA_DIR holds: an HDF5 file read in batches (``data.stream``), an image folder and
TFRecord files. Rank 0 prints one JSON line per job.
"""

from __future__ import annotations

import json
import math
import sys

import mpi_trainer

placed = mpi_trainer.init()  # before Keras builds anything, as hvd.init() comes first

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from mpi_trainer.errors import InputError  # noqa: E402

OVERRIDES = {"log.plots": False, "log.tensorboard": False}


class DigitBatches(keras.utils.PyDataset):
    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return math.ceil(len(self.x) / self.batch)

    def __getitem__(self, index):
        rows = slice(index * self.batch, (index + 1) * self.batch)
        return self.x[rows], self.y[rows]


def batches_of_my_own(x, y, rank):
    rng = np.random.default_rng(rank)  # each rank's own stream (the Horovod convention)
    while True:
        rows = rng.integers(0, len(x), 32)
        yield x[rows], y[rows]


def horovod_style(x, y, x_test, y_test, run_dir):
    dataset = tf.data.Dataset.from_tensor_slices((tf.cast(x[..., tf.newaxis], tf.float32), tf.cast(y, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(128)
    model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                              keras.layers.Flatten(), keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return mpi_trainer.fit(model, dataset, steps_per_epoch=20, epochs=3, run_dir=run_dir, overrides=OVERRIDES,
                           validation_data=(x_test[..., np.newaxis], y_test))


def classifier(input_shape, num_outputs):
    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(num_outputs, activation="softmax")])


def report(name, result):
    if placed.is_scheduler:  # every rank holds the History; rounds.csv's numbers are on it
        print(json.dumps({"job": name, "history": result.rounds, "summary": result.summary}), flush=True)


def main(run_dir: str) -> None:
    x, y = load_digits(return_X_y=True)
    images = (x / 16.0).reshape(-1, 8, 8).astype(np.float32)
    report("tf.data", horovod_style(images[:1500], y[:1500], images[1500:], y[1500:], run_dir + "/tfdata"))
    flat = (x / 16.0).astype(np.float32)
    common = {"epochs": 2, "overrides": {**OVERRIDES, "model.learning_rate": 0.01}}
    report("PyDataset", mpi_trainer.fit(classifier, DigitBatches(flat, y, 32), run_dir=run_dir + "/pydataset",
                                        validation_data=DigitBatches(flat[-300:], y[-300:], 32), **common))
    report("generator", mpi_trainer.fit(classifier, batches_of_my_own(flat, y, placed.rank), steps_per_epoch=30,
                                        validation_data=(flat[-300:], y[-300:]), run_dir=run_dir + "/generator",
                                        **common))
    try:
        mpi_trainer.fit(classifier, batches_of_my_own(flat, y, placed.rank), steps_per_epoch=30,
                        validation_data=(flat[-300:], y[-300:]), run_dir=run_dir + "/refused",
                        config={"data": {"increment": {"enabled": True}}}, **common)
    except InputError:
        print(json.dumps({"job": "refused", "rank": placed.rank}), flush=True)


def config_sources(run_dir: str, data_dir: str) -> None:
    sources = {"hdf5": {"source": f"{data_dir}/digits.h5", "stream": True},
               "images": {"source": f"{data_dir}/images", "image_size": [8, 8], "color_mode": "grayscale"},
               "tfrecord": {"source": f"{data_dir}/records/digits-*.tfrecord", "features": ["image"],
                            "label": "label", "feature_shape": [8, 8, 1]}}
    for name, data in sources.items():
        result = mpi_trainer.fit("lenet", config={"data": data}, epochs=2, batch_size=16, run_dir=f"{run_dir}/{name}",
                                 overrides={**OVERRIDES, "model.learning_rate": 0.003})
        report(name, result)


if __name__ == "__main__":
    main(sys.argv[1])
    config_sources(sys.argv[1], sys.argv[2])
