"""One rank of the ``fit`` race in the pipelines suite: LeNet on real digits, as a tf.data pipeline or as arrays.

    mpirun -n 3 python -m benchmarks.fit_inputs {tf.data|arrays} DIGITS.npz RUN_DIR ROUNDS

Every rank runs this script, as in a Horovod script. Both kinds train on the same 4,000 training
digits in batches of 64 and score the same 1,000 test digits (``validation_data``) every round;
the suite reads the times and accuracies from ``RUN_DIR/rounds.csv``. The pipeline is written as a
Horovod script writes it, with no options of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BATCH = 64


def scaled(images: np.ndarray) -> np.ndarray:
    return (images[..., None] / 255.0).astype(np.float32)


def fit(kind: str, digits: Path, run_dir: Path, rounds: int) -> None:
    import mpi_trainer

    mpi_trainer.init()
    with np.load(digits) as data:
        x, y = scaled(data["x_train"]), data["y_train"]
        validation = (scaled(data["x_test"]), data["y_test"])
    common = {"validation_data": validation, "epochs": rounds, "run_dir": run_dir,
              "overrides": {"log.plots": False, "checkpoint.every": 0, "train.seed": 0}}
    if kind == "tf.data":
        import tensorflow as tf

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=0).batch(BATCH)
        mpi_trainer.fit("lenet", dataset, **common)
    elif kind == "arrays":
        mpi_trainer.fit("lenet", x, y, batch_size=BATCH, **common)
    else:
        raise SystemExit(f"unknown input kind {kind!r}; expected 'tf.data' or 'arrays'")


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit(__doc__.splitlines()[2].strip())
    fit(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]))
