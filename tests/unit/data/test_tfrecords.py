"""Config sources read as tf.data pipelines: an image folder and TFRecord files, and what they refuse."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from mpi_trainer.config import config_from_dict
from mpi_trainer.data.pipelines import pipeline_source
from mpi_trainer.errors import ConfigError, DataError


def digit_images(classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    keep = y < classes
    return (x[keep] * 255 / 16).astype(np.uint8).reshape(-1, 8, 8, 1), y[keep]


def image_folder(root, classes: int = 3):
    import keras

    x, y = digit_images(classes)
    for index, (image, label) in enumerate(zip(x, y)):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        keras.utils.save_img(folder / f"{index}.png", image, scale=False)
    return root


def tfrecord_files(root, files: int = 4):
    x, y = digit_images()
    root.mkdir(parents=True, exist_ok=True)
    for part in range(files):
        with tf.io.TFRecordWriter(str(root / f"digits-{part}.tfrecord")) as writer:
            for image, label in zip(x[part::files], y[part::files]):
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return root


def records_section(root) -> dict:
    return {"source": str(root / "digits-*.tfrecord"), "features": ["image"], "label": "label",
            "feature_shape": [8, 8, 1]}


def test_an_image_folders_test_split_is_keras_validation_split(tmp_path):
    root = image_folder(tmp_path / "images", classes=2)
    data = {"source": str(root), "image_size": [8, 8], "color_mode": "grayscale", "test_size": 0.25}
    dataset = pipeline_source(config_from_dict({"data": data}), 2)
    assert dataset.input_shape == (8, 8, 1) and len(dataset.y_test) == 90  # 25 % of 360


def test_an_image_folder_with_one_class_is_refused(tmp_path):
    root = image_folder(tmp_path / "images", classes=1)
    cfg = config_from_dict({"data": {"source": str(root), "image_size": [8, 8]}})
    with pytest.raises(DataError, match=r"at least two classes. Received: data.source=.* with classes \['class_0'\]"):
        pipeline_source(cfg, 2)


def test_tfrecord_files_are_the_blocks_and_the_last_is_the_test_split(tmp_path):
    root = tfrecord_files(tmp_path / "records")
    dataset = pipeline_source(config_from_dict({"data": records_section(root), "train": {"batch_size": 16}}), 2)
    assert len(dataset.y_test) == 134  # the last of the four files
    assert dataset.train.block_bounds(2) == [(0, 17), (17, 26)]  # files 0 and 2 (269 records) for worker 1, file 1


def test_a_corrupt_tfrecord_fails_before_training(tmp_path):
    root = tfrecord_files(tmp_path / "records")
    damaged = root / "digits-1.tfrecord"
    damaged.write_bytes(damaged.read_bytes()[:-7])
    cfg = config_from_dict({"data": records_section(root)})
    with pytest.raises(DataError, match=r"Cannot read the TFRecord file .*digits-1.tfrecord.*Received a corrupt"):
        pipeline_source(cfg, 2)


def test_a_worker_without_a_tfrecord_file_is_an_empty_shard(tmp_path):
    root = tfrecord_files(tmp_path / "records", files=2)
    cfg = config_from_dict({"data": records_section(root)})
    dataset = pipeline_source(cfg, 2)
    with pytest.raises(DataError, match=r"the shard dataset_fn built for worker 2 of 2 is empty"):
        dataset.train.block_bounds(2)


def test_a_tfrecord_source_needs_its_feature_spec(tmp_path):
    root = tfrecord_files(tmp_path / "records")
    with pytest.raises(ConfigError, match=r"`data.feature_shape` must give one sample's shape"):
        config_from_dict({"data": {**records_section(root), "feature_shape": []}})
