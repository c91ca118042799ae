"""Arrays given to fit keep their values: a model that rescales inside (Rescaling(1/255)) is not scaled twice.
A file or a built-in keeps its documented preprocessing (uint8 scaled to [0, 1])."""

from __future__ import annotations

import numpy as np

from mpi_trainer.config import load_config
from mpi_trainer.data.readers import RawArrays
from mpi_trainer.data.sources import load_dataset


def test_uint8_arrays_given_to_fit_are_not_scaled():
    x = np.arange(40 * 4, dtype=np.int64).reshape(40, 4).astype(np.uint8)
    y = np.arange(40) % 2
    cfg = load_config({"data": {"source": "arrays", "test_size": 0.25}})
    dataset = load_dataset(cfg.data, 0, arrays=RawArrays(x, y))
    train_x, _ = dataset.train.read(np.arange(len(dataset.train)))
    assert train_x.max() > 100 and dataset.x_test.max() > 100  # values as given, not divided by 255
    assert set(np.unique(train_x)) <= set(np.unique(x).astype(np.float32))


def test_a_file_keeps_its_documented_scaling(tmp_path):
    x = np.full((40, 4), 255, dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(40) % 2)
    cfg = load_config({"data": {"source": str(tmp_path / "d.npz"), "test_size": 0.25}})
    dataset = load_dataset(cfg.data, 0)
    assert float(dataset.x_test.max()) == 1.0
