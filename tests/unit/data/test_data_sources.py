"""Sources (.npz, .h5, .csv, built-ins), splits, and bad data: in-process, no MPI."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_trainer.config import ConfigError, load_config
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import DataError


def _load(*overrides: str, **kwargs):
    cfg = load_config(None, list(overrides))
    return load_dataset(cfg.data, cfg.train.seed, **kwargs)


def _images(n: int = 120, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    x = (rng.random((n, 6, 6)) * 50 + y[:, None, None] * 60).astype(np.uint8)
    return x, y


def _h5(path: Path, **arrays: np.ndarray) -> Path:
    with h5py.File(path, "w") as handle:
        for name, array in arrays.items():
            handle.create_dataset(name, data=array)
    return path


def test_h5_keras_layout_matches_npz_of_the_same_arrays(tmp_path):
    x, y = _images()
    arrays = dict(x_train=x[:100], y_train=y[:100], x_test=x[100:], y_test=y[100:])
    from_h5 = _load(f"data.source={_h5(tmp_path / 'd.h5', **arrays)}", "data.validation_size=0.1")
    np.savez(tmp_path / "d.npz", **arrays)
    from_npz = _load(f"data.source={tmp_path / 'd.npz'}", "data.validation_size=0.1")
    assert from_h5.input_shape == (6, 6, 1) and from_h5.num_outputs == 3
    assert from_h5.num_train == 90 and len(from_h5.y_val) == 10 and len(from_h5.y_test) == 20
    np.testing.assert_array_equal(from_h5.x_train, from_npz.x_train)
    np.testing.assert_array_equal(from_h5.x_test, from_npz.x_test)
    assert from_h5.x_train.max() <= 1.0  # uint8 scaled like every other source


def test_h5_named_datasets_and_row_reads(tmp_path):
    x, y = _images()
    path = _h5(tmp_path / "d.h5", features=x.astype(np.float32), classes=y)
    data = _load(f"data.source={path}", "data.datasets=['features', 'classes']")
    assert isinstance(data.train.features, h5py.Dataset)  # features stay on disk
    positions = np.array([7, 2, 40])
    xs, ys = data.train.read(positions)
    rows = data.train.rows[positions]
    np.testing.assert_array_equal(xs[..., 0], x[rows].astype(np.float32))
    np.testing.assert_array_equal(ys, y[rows])


def test_h5_without_the_named_datasets_is_an_error(tmp_path):
    path = _h5(tmp_path / "d.h5", images=np.zeros((10, 4)), labels=np.zeros(10))
    with pytest.raises(DataError, match=r"must hold datasets x_train.*Received: \['images', 'labels'\]"):
        _load(f"data.source={path}")
    with pytest.raises(DataError, match=r"names arrays .*\['x'\].*data.datasets=\['x', 'labels'\]"):
        _load(f"data.source={path}", "data.datasets=['x', 'labels']")


def test_uncompressed_npz_features_are_memory_mapped(tmp_path):
    x, y = _images()
    np.savez(tmp_path / "plain.npz", x=x, y=y)
    np.savez_compressed(tmp_path / "packed.npz", x=x, y=y)
    plain = _load(f"data.source={tmp_path / 'plain.npz'}")
    packed = _load(f"data.source={tmp_path / 'packed.npz'}")
    assert isinstance(plain.train.features, np.memmap)
    assert not isinstance(packed.train.features, np.memmap)
    np.testing.assert_array_equal(plain.x_train, packed.x_train)


def _admissions(path: Path, rows: int = 60, label_text: bool = True) -> Path:
    rng = np.random.default_rng(1)
    lines = ["gre,gpa,rank,admitted"]
    for _ in range(rows):
        gre, gpa, rank = rng.integers(300, 800), rng.uniform(2, 4), rng.integers(1, 5)
        admitted = gre / 800 + gpa / 4 - rank / 4 > 0.9
        label = ("yes" if admitted else "no") if label_text else str(int(admitted))
        lines.append(f"{gre},{gpa:.2f},{rank},{label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_csv_label_column_string_labels_and_train_only_standardisation(tmp_path):
    path = _admissions(tmp_path / "admit.csv")
    data = _load(f"data.source={path}", "data.label=admitted")
    assert data.class_names == ["no", "yes"] and data.num_outputs == 2
    assert data.label_mapping() == {"no": 0, "yes": 1}
    assert data.input_shape == (3,)
    np.testing.assert_allclose(data.x_train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(data.x_train.std(axis=0), 1, atol=1e-5)
    assert np.abs(data.x_test.mean(axis=0)).max() > 1e-3  # test split scaled with train statistics


def test_csv_feature_subset_and_default_label(tmp_path):
    path = _admissions(tmp_path / "admit.csv", label_text=False)
    subset = _load(f"data.source={path}", "data.label=admitted", "data.features=['gre', 'gpa']")
    assert subset.input_shape == (2,) and subset.class_names is None
    assert _load(f"data.source={path}").input_shape == (3,)  # label defaults to the last column


def test_csv_missing_columns_and_text_features_are_errors(tmp_path):
    path = _admissions(tmp_path / "admit.csv")
    with pytest.raises(DataError, match=r"Received: data.label='admit'; columns are \['gre'"):
        _load(f"data.source={path}", "data.label=admit")
    with pytest.raises(DataError, match=r"\['toefl'\]. Received: data.features=\['gre', 'toefl'\]"):
        _load(f"data.source={path}", "data.label=admitted", "data.features=['gre', 'toefl']")
    path.write_text("a,b,label\n1,x,0\n2,3,1\n")
    with pytest.raises(DataError, match=r"column 'b' line 2: features must be numbers. Received: 'x'"):
        _load(f"data.source={path}")


def test_label_and_features_keys_apply_to_csv_and_tfrecord_only():
    expected = "`data.label` applies to .csv and TFRecord sources only. Received: data.label='species'"
    with pytest.raises(ConfigError, match=expected):
        load_config(None, ["data.source=iris", "data.label=species"])
    with pytest.raises(ConfigError, match=r"Received: data.features=\['petal'\]"):
        load_config(None, ["data.source=iris", "data.features=['petal']"])


@pytest.mark.parametrize("bad, message", [
    ("nan", "contains NaN or inf values"),
    ("inf", "contains NaN or inf values"),
    ("negative", "labels must be >= 0. Received a label -1"),
    ("text", "labels must be integer class indices or numeric targets. Received dtype <U"),
    ("short", "x_all and y_all differ in length. Received: 120 feature rows, 119 labels"),
])
def test_bad_arrays_fail_with_a_clear_message(tmp_path, bad, message):
    x, y = _images()
    x, y = x.astype(np.float64), y.astype(object)
    if bad in ("nan", "inf"):
        x[5, 0, 0] = np.nan if bad == "nan" else np.inf
    y = {"negative": np.where(np.arange(120) == 3, -1, y), "text": y.astype(str), "short": y[:-1]}.get(bad, y)
    np.savez(tmp_path / "bad.npz", x=x, y=np.asarray(y.tolist()))
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(".", r"\.")):
        data = _load(f"data.source={tmp_path / 'bad.npz'}", "data.test_size=0.5")
        data.train.read(np.arange(data.num_train))  # NaN in a block is found by whoever reads it


def test_test_labels_outside_the_training_classes_are_out_of_range(tmp_path):
    x, y = _images()
    np.savez(tmp_path / "d.npz", x_train=x[:100], y_train=y[:100], x_test=x[100:],
             y_test=np.full(20, 7))
    with pytest.raises(DataError, match="test label 7 is out of range: the training split has classes 0..2"):
        _load(f"data.source={tmp_path / 'd.npz'}")


def test_validation_labels_outside_the_training_classes_are_out_of_range(tmp_path):
    """A class that only the validation split holds is refused before training, as one only in test is."""
    from mpi_trainer.data.sources import split_positions

    x, y = _images()
    cfg = load_config(None, ["data.validation_size=0.2"])
    _, validation = split_positions(100, cfg.data.validation_size, cfg.train.seed + 1)
    y_train = y[:100].copy()
    y_train[validation[0]] = 8  # the one row of class 8 lands in the validation split
    np.savez(tmp_path / "d.npz", x_train=x[:100], y_train=y_train, x_test=x[100:], y_test=y[100:])
    with pytest.raises(DataError, match="validation label 8 is out of range: the training split has classes 0..2"):
        _load(f"data.source={tmp_path / 'd.npz'}", "data.validation_size=0.2")


def test_empty_split_and_too_few_samples_for_the_workers(tmp_path):
    x, y = _images(2)
    np.savez(tmp_path / "tiny.npz", x=x, y=y)
    with pytest.raises(DataError, match="the train split is empty"):
        _load(f"data.source={tmp_path / 'tiny.npz'}", "data.test_size=0.5", "data.validation_size=0.5")
    with pytest.raises(ValueError, match="one training sample per worker. Received: 9 samples for 10"):
        block_bounds(9, 10)


def test_validation_split_comes_from_training_and_workers_skip_evaluation_reads():
    full = _load("data.source=digits", "data.validation_size=0.25")
    assert len(full.y_val) == round(0.25 * (full.num_train + len(full.y_val)))
    worker = _load("data.source=digits", "data.validation_size=0.25", read_val=False, read_test=False)
    assert len(worker.y_val) == len(worker.y_test) == 0 and worker.num_train == full.num_train
    np.testing.assert_array_equal(worker.train.rows, full.train.rows)


@pytest.mark.parametrize("name, where", [("cifar10", "cifar-10-batches-py"),
                                         ("fashion_mnist", "fashion-mnist")])
def test_keras_builtins_offline_say_which_file_to_put_where(tmp_path, monkeypatch, name, where):
    import keras

    def offline() -> None:  # what Keras' loader does here: the download fails
        raise Exception("URL fetch failure: [Errno -3] Temporary failure in name resolution")

    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", offline)
    expected = rf"'{name}' is not available offline .*Put Keras' copy at {tmp_path}/datasets/{where}"
    with pytest.raises(DataError, match=expected):
        _load(f"data.source={name}")


def test_under_scatter_only_rank_0_needs_the_file(tmp_path):
    from mpi_trainer.trainer.config_fit import _dataset

    missing = tmp_path / "on_rank_0_only.h5"
    with pytest.raises(ConfigError, match="names a data file that does not exist"):
        load_config(None, [f"data.source={missing}"])
    cfg = load_config(None, [f"data.source={missing}", "data.placement=scatter"])  # a worker's node may not see it
    with pytest.raises(DataError, match=rf"does not exist. Received: data.source='{missing}'"):
        _dataset(cfg, 2)  # rank 0 reads it


def test_scatter_checks_every_training_row_on_rank_0_before_sending(tmp_path):
    from mpi_trainer.trainer.config_fit import _dataset

    x, y = _images()
    x = x.astype(np.float32)
    clean_h5 = _h5(tmp_path / "clean.h5", x=x, y=y)
    clean = load_config(None, [f"data.source={clean_h5}", "data.placement=scatter"])
    x[int(_dataset(clean, 2).train.rows[-1])] = np.inf  # the last training row
    dirty_h5 = _h5(tmp_path / "dirty.h5", x=x, y=y)
    dirty = load_config(None, [f"data.source={dirty_h5}", "data.placement=scatter"])
    with pytest.raises(DataError, match="dirty.h5: x_train contains NaN or inf"):
        _dataset(dirty, 2)
