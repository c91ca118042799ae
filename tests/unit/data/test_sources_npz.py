"""Loading .npz files in both layouts, the digits built-in and MNIST from Keras' cache."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.config import DataConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import DataError


def test_keras_layout_scales_uint8_and_adds_a_channel(tiny_npz):
    data = load_dataset(DataConfig(source=str(tiny_npz), validation_size=0.1), seed=0)
    assert data.x_train.dtype == np.float32 and 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    assert data.input_shape == (8, 8, 1) and data.num_outputs == 3
    assert len(data.x_test) == 60 and len(data.x_train) + len(data.x_val) == 300 and len(data.x_val) == 30


def test_xy_layout_is_split_by_test_size_reproducibly(tmp_path):
    path = tmp_path / "xy.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 4, 200))
    cfg = DataConfig(source=str(path), test_size=0.25, validation_size=0.0)
    first, second = load_dataset(cfg, seed=3), load_dataset(cfg, seed=3)
    assert len(first.x_test) == 50 and len(first.x_train) == 150 and len(first.x_val) == 0
    np.testing.assert_array_equal(first.x_train, second.x_train)


def test_one_hot_and_regression_targets_pass_through_as_given(tmp_path):
    path = tmp_path / "onehot.npz"
    y = np.eye(3, dtype=np.float32)[np.arange(30) % 3]
    np.savez(path, x=np.ones((30, 2), np.float32), y=y)
    data = load_dataset(DataConfig(source=str(path), test_size=0.2, validation_size=0.0), seed=0)
    assert not data.classes and data.num_outputs == 3 and data.label_shape == (3,)
    np.testing.assert_array_equal(data.y_train, y[data.train.rows])
    # whole-number floats (e.g. a regression target in dollars) are values, not 151 classes
    np.savez(path, x=np.ones((30, 2), np.float32), y=np.arange(30, dtype=np.float64) * 10)
    data = load_dataset(DataConfig(source=str(path), test_size=0.2, validation_size=0.0), seed=0)
    assert not data.classes and data.num_outputs == 1 and data.y_train.dtype == np.float32
    np.testing.assert_array_equal(data.y_train, (np.arange(30) * 10.0)[data.train.rows])


@pytest.mark.parametrize(
    "arrays, fragment",
    [
        ({"x": np.ones((10, 2)), "y": np.zeros(9)}, "differ in length. Received: 10 feature rows, 9 labels"),
        ({"x": np.full((10, 2), np.nan), "y": np.zeros(10)}, "contains NaN or inf"),
        ({"x": np.ones((10, 2)), "y": np.full(10, "a")}, "labels must be integer class indices or numeric"),
        ({"x": np.ones((10, 2)), "y": -np.ones(10, dtype=np.int64)}, "labels must be >= 0"),
        ({"pixels": np.ones(3)}, "must hold arrays x_train, y_train, x_test, y_test or x, y"),
    ],
)
def test_bad_npz_contents_are_named(tmp_path, arrays, fragment):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=fragment.replace("(", r"\(")):
        load_dataset(DataConfig(source=str(path), validation_size=0.0), seed=0)


def test_digits_is_available_offline():
    data = load_dataset(DataConfig(source="digits"), seed=0)
    assert data.input_shape == (8, 8, 1) and data.num_outputs == 10
    assert len(data.x_train) + len(data.x_val) + len(data.x_test) == 1797


def test_mnist_is_read_from_keras_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    (tmp_path / "datasets").mkdir()
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(50, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=50, dtype=np.uint8)
    np.savez(tmp_path / "datasets" / "mnist.npz", x_train=images[:40], y_train=labels[:40],
             x_test=images[40:], y_test=labels[40:])
    data = load_dataset(DataConfig(source="mnist", validation_size=0.0), seed=0)
    assert data.input_shape == (28, 28, 1) and len(data.x_train) == 40 and len(data.x_test) == 10


def test_mnist_offline_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    with pytest.raises(DataError, match=f"Put Keras' copy at {tmp_path}/datasets/mnist.npz"):
        load_dataset(DataConfig(source="mnist"), seed=0)
