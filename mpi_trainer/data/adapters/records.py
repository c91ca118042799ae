"""Config sources read as ``tf.data`` pipelines: an image folder and TFRecord files (TensorFlow backend).

Image folder: ``data.source`` is a directory with one sub-directory of images per class, as
``keras.utils.image_dataset_from_directory`` reads it (``data.image_size``, ``data.color_mode``).
Keras' own ``validation_split`` (``data.test_size``, seeded with ``train.seed``) splits the files
into the training and the test pipelines, so every rank holds out the same files; pixels are
scaled to [0, 1]. The training batches are cut into blocks like any ``tf.data.Dataset``.

TFRecords: ``data.source`` is a file or a glob. Each ``tf.train.Example`` holds a sample in the
feature ``data.features[0]`` (raw bytes for ``feature_dtype = "uint8"``, scaled to [0, 1]; a float
list for ``"float32"``) of shape ``data.feature_shape``, and its class index in ``data.label``. The
files are the blocks: the last ``data.test_size`` of the sorted files are the test split, and
worker *i* of *W* reads training files ``i, i + W, ...`` (a ``dataset_fn`` shard). Every record is
counted once at set-up, which also finds a corrupt file before training.
"""

from __future__ import annotations

import glob
import math
from pathlib import Path
from typing import Any

from mpi_trainer.config import Config
from mpi_trainer.data.adapters.tf_dataset import TFDatasetAdapter, require_tensorflow_backend
from mpi_trainer.errors import DataError

IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def image_folder(cfg: Config) -> tuple[TFDatasetAdapter, Any]:
    """The training pipeline's adapter and the test pipeline of an image folder."""
    require_tensorflow_backend("image folder")
    import keras

    root = Path(cfg.data.source).expanduser()
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if len(classes) < 2:
        raise DataError(f"An image folder needs one sub-directory of images per class, and at least two classes. "
                        f"Received: data.source={cfg.data.source!r} with classes {classes}")
    train, test = keras.utils.image_dataset_from_directory(
        root, labels="inferred", label_mode="int", class_names=classes, color_mode=cfg.data.color_mode,
        batch_size=cfg.train.batch_size, image_size=tuple(cfg.data.image_size), shuffle=True,
        seed=cfg.train.seed, validation_split=cfg.data.test_size, subset="both", verbose=False)
    adapter = TFDatasetAdapter(dataset=train.map(_scaled))
    adapter.kind = "image folder"
    return adapter, test.map(_scaled)


def _scaled(x: Any, y: Any) -> tuple[Any, Any]:
    return x / 255.0, y


def _files(cfg: Config) -> list[str]:
    files = sorted(glob.glob(str(Path(cfg.data.source).expanduser())))
    if len(files) < 2:
        raise DataError(f"TFRecords are split by file, so at least two files are needed (the last "
                        f"data.test_size of them are the test split). Received: data.source={cfg.data.source!r} "
                        f"matching {len(files)} files")
    return files


def _parser(cfg: Config) -> Any:
    import tensorflow as tf

    name, label, shape = cfg.data.features[0], cfg.data.label, list(cfg.data.feature_shape)
    raw = cfg.data.uint8_features
    spec = {name: tf.io.FixedLenFeature([], tf.string) if raw else tf.io.FixedLenFeature(shape, tf.float32),
            label: tf.io.FixedLenFeature([], tf.int64)}

    def parse(record: Any) -> tuple[Any, Any]:
        example = tf.io.parse_single_example(record, spec)
        x = example[name]
        if raw:
            x = tf.cast(tf.reshape(tf.io.decode_raw(x, tf.uint8), shape), tf.float32) / 255.0
        return x, example[label]
    return parse


def count_records(path: str) -> int:
    """Records in one file, read to the end: a truncated or corrupt file fails here, before training."""
    import tensorflow as tf

    try:
        return sum(1 for _ in tf.data.TFRecordDataset(path))
    except tf.errors.OpError as exc:
        raise DataError(f"Cannot read the TFRecord file {path!r}: {exc.message.splitlines()[0]}. Received a corrupt "
                        f"or truncated file; expected TFRecords written by tf.io.TFRecordWriter") from None


def _batched(files: list[str], counts: dict[str, int], cfg: Config) -> Any:
    import tensorflow as tf

    batches = math.ceil(sum(counts[f] for f in files) / cfg.train.batch_size)
    dataset = tf.data.TFRecordDataset(files).map(_parser(cfg)).batch(cfg.train.batch_size)
    return dataset.apply(tf.data.experimental.assert_cardinality(batches))


def tfrecords(cfg: Config) -> tuple[TFDatasetAdapter, Any]:
    """The training files' adapter (one file shard per worker) and the test files' pipeline."""
    require_tensorflow_backend("TFRecord source")
    files = _files(cfg)
    held = max(1, round(len(files) * cfg.data.test_size))
    train, test = files[:-held], files[-held:]
    counts = {path: count_records(path) for path in files}

    def dataset_fn(context: Any) -> Any:
        mine = train[context.input_pipeline_id::context.num_input_pipelines]
        return _batched(mine, counts, cfg)

    adapter = TFDatasetAdapter(dataset_fn=dataset_fn)
    adapter.kind = "TFRecord source"
    return adapter, _batched(test, counts, cfg)
