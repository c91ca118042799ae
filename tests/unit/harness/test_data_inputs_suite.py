"""The data_inputs benchmark suite without running a job: registration, its figures, and that every input
kind it compares holds the same digits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import digits as real
from benchmarks.harness import Comparison, run_comparison
from benchmarks.suites import SUITES, data_inputs, pipelines
from mpi_trainer.config import load_config


def test_the_suite_is_registered_and_its_quick_tables_name_their_command_and_targets():
    assert SUITES["data_inputs"] is data_inputs
    tables = data_inputs.comparisons(quick=True)
    assert [len(table.variants) for table in tables] == [2, 3, 3]
    assert {table.command for table in tables} == {"python -m benchmarks run data_inputs --quick"}
    assert all("Target" in table.notes for table in tables)
    assert data_inputs.comparisons(quick=False)[0].variants.keys() == {"300 MB file", "3,000 MB file"}


def test_the_pipelines_suite_races_a_tf_data_pipeline_against_arrays_with_the_same_files():
    assert SUITES["pipelines"] is pipelines and pipelines.prepared is data_inputs.prepared
    (race,) = pipelines.comparisons(quick=False)
    assert list(race.variants) == ["tf.data", "arrays", "ratio tf.data / arrays"]
    assert race.command == "python -m benchmarks run pipelines" and "1.05x" in race.notes


def test_the_files_a_run_wrote_are_removed_when_it_ends_even_on_failure():
    with pytest.raises(KeyboardInterrupt), data_inputs.prepared():
        folder = data_inputs.scratch()
        (folder / "digits-3000000.h5").write_bytes(b"rows")
        raise KeyboardInterrupt
    assert not folder.exists() and data_inputs.scratch.cache_info().currsize == 0


def test_a_ratio_row_divides_the_two_variants_of_the_same_repeat():
    speeds = iter([100.0, 50.0, 90.0, 60.0])
    variants = data_inputs.side_by_side(("streamed", lambda: {"rate": next(speeds)}),
                                        ("in memory", lambda: {"rate": next(speeds)}))
    table = run_comparison(Comparison("t", "cmd", variants, {"rate": "samples/s"}), repeats=2, log=lambda _: None)
    assert table.rows["ratio streamed / in memory"]["rate"].runs == [2.0, 1.5]


def test_the_race_counts_seconds_to_the_first_round_at_the_target():
    rows = [{"val_accuracy": "0.90", "elapsed_seconds": "10", "wall_seconds": "10"},
            {"val_accuracy": "0.961", "elapsed_seconds": "18", "wall_seconds": "8"},
            {"val_accuracy": "0.955", "elapsed_seconds": "26", "wall_seconds": "8"}]
    figures = data_inputs.race_figures(rows, 0.96)
    assert (figures["seconds_to_target"], figures["rounds_to_target"], figures["final_accuracy"]) == (18.0, 2.0, 0.955)
    assert math.isnan(data_inputs.race_figures(rows, 0.97)["seconds_to_target"])  # never reached: no figure


def test_worker_peaks_are_read_from_the_line_a_stopping_worker_logs(capsys):
    from mpi_trainer.logs import setup_logging

    for rank, mib in ((1, 912.25), (2, 1034.5)):
        setup_logging(rank, 3, "node-a", 2).debug("stop received; peak RSS %.1f MiB", mib)
    setup_logging(0, 1, "node-a", 1)
    assert data_inputs.worker_peaks(capsys.readouterr().out) == {"rss_rank_1": 912.2, "rss_rank_2": 1034.5}
    with pytest.raises(RuntimeError, match="peak RSS of 2 workers"):
        data_inputs.worker_peaks("no worker logged")


def test_upsampled_h5_repeats_shifted_training_digits_and_keeps_the_test_digits(tmp_path):
    import h5py

    digits = tiny_digits(10)
    with h5py.File(real.write_h5(tmp_path / "d.h5", 25, digits), "r") as handle:
        assert handle["x_train"].shape == (25, 28, 28) and handle["x_train"].dtype == np.uint8
        assert sorted(handle["y_train"][:10]) == sorted(digits["y_train"])  # one shuffled copy after another
        np.testing.assert_array_equal(handle["x_test"][:], digits["x_test"])


def test_arrays_image_folder_and_tfrecords_hold_the_same_split_of_the_same_digits(tmp_path, monkeypatch):
    digits = tiny_digits(40)  # 50 digits: 10 held out, as the 2 last of 10 TFRecord files
    images = np.concatenate([digits["x_train"], digits["x_test"]])
    labels = np.concatenate([digits["y_train"], digits["y_test"]])
    monkeypatch.setattr(data_inputs, "scratch", lambda: tmp_path)
    monkeypatch.setattr(data_inputs, "all_digits", lambda: (images, labels))
    data_inputs.image_folder.cache_clear()
    data_inputs.same_split.cache_clear()
    try:
        npz, records = data_inputs.same_split(0)
        with np.load(npz) as arrays:
            test_x, test_y = arrays["x_test"], arrays["y_test"]
        _, held = real.keras_split(tmp_path / "images", 0, data_inputs.TEST_SIZE)
        np.testing.assert_array_equal(test_x, images[held])
        from_records = [record_image(path) for path in sorted(tmp_path.glob("records-0/*.tfrecord"))[-2:]]
        np.testing.assert_array_equal(np.concatenate(from_records), test_x)
        for kind in data_inputs.KINDS:  # the overrides each job gets make a valid config
            assert load_config(data_inputs.QUICKSTART, data_inputs.input_sets(kind, 0)).data.test_size >= 0
        assert str(tmp_path) in records and len(test_y) == 10
    finally:
        data_inputs.image_folder.cache_clear()
        data_inputs.same_split.cache_clear()


def tiny_digits(train: int) -> real.Digits:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(train + train // 4, 28, 28), dtype=np.uint8)
    labels = np.arange(len(images)) % 3
    return {"x_train": images[:train], "y_train": labels[:train], "x_test": images[train:], "y_test": labels[train:]}


def record_image(path) -> np.ndarray:
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    records = tf.data.TFRecordDataset(str(path))
    parsed = [tf.io.parse_single_example(record, spec)["image"].numpy() for record in records]
    return np.stack([np.frombuffer(raw, dtype=np.uint8).reshape(28, 28) for raw in parsed])
