"""Real MNIST digits for the data-input benchmarks, written as each input kind holds them.

The digits are :func:`benchmarks.data.mnist5k`'s 5,000 real MNIST images (uint8 28x28, 4,000 train,
1,000 test, Keras' layout). From them:

* :func:`write_h5`: an HDF5 file of any size, the training digits repeated, each copy shifted by up
  to 2 pixels (the file a worker streams; the test digits as they are);
* :func:`write_image_folder`: every digit as a PNG in ``image_dataset_from_directory``'s layout
  (one sub-directory per class), and :func:`keras_split`: which files Keras holds out;
* :func:`write_tfrecords`: the same digits as ``tf.train.Example`` records (raw bytes), in files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

Digits = dict[str, np.ndarray]
SIDE = 28


def load(path: Path) -> Digits:
    with np.load(path) as data:
        return {name: data[name] for name in ("x_train", "y_train", "x_test", "y_test")}


def write_npz(path: Path, digits: Digits) -> Path:
    np.savez(path, **digits)
    return path


def shifted(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The images moved by the same random shift of up to 2 pixels each way."""
    dy, dx = rng.integers(-2, 3, size=2)
    return np.roll(images, (int(dy), int(dx)), axis=(1, 2))


def write_h5(path: Path, samples: int, digits: Digits, seed: int = 0) -> Path:
    """``samples`` training digits, upsampled from ``digits``' training split a shuffled, shifted copy at a
    time (so memory stays at one copy whatever the size), and the real test digits as they are."""
    import h5py

    rng = np.random.default_rng(seed)
    base_x, base_y = digits["x_train"], digits["y_train"]
    with h5py.File(path, "w") as handle:
        x = handle.create_dataset("x_train", shape=(samples, SIDE, SIDE), dtype="uint8")
        y = handle.create_dataset("y_train", shape=(samples,), dtype="int64")
        for start in range(0, samples, len(base_y)):
            end = min(samples, start + len(base_y))
            order = rng.permutation(len(base_y))[:end - start]
            x[start:end], y[start:end] = shifted(base_x[order], rng), base_y[order]
        handle.create_dataset("x_test", data=digits["x_test"])
        handle.create_dataset("y_test", data=digits["y_test"])
    return path


def write_image_folder(root: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    """One grayscale PNG per image, ``root/<class>/<index>.png``; the index keeps the image's row."""
    import tensorflow as tf

    for index, (image, label) in enumerate(zip(images, labels)):
        folder = root / f"{int(label)}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:06d}.png").write_bytes(tf.io.encode_png(image[..., None]).numpy())
    return root


def keras_split(root: Path, seed: int, test_size: float) -> tuple[np.ndarray, np.ndarray]:
    """The rows (file indices) of Keras' training and held-out files, in Keras' order: what
    ``image_dataset_from_directory(validation_split=test_size, seed=seed)`` gives mpi_trainer's image folder."""
    import keras

    train, test = keras.utils.image_dataset_from_directory(
        root, labels="inferred", label_mode="int", color_mode="grayscale", image_size=(SIDE, SIDE),
        shuffle=True, seed=seed, validation_split=test_size, subset="both", verbose=False)
    return _rows(train.file_paths), _rows(test.file_paths)


def _rows(paths: list[str]) -> np.ndarray:
    return np.array([int(Path(path).stem) for path in paths], dtype=np.int64)


def write_tfrecords(folder: Path, name: str, images: np.ndarray, labels: np.ndarray, files: int) -> list[Path]:
    """The images in ``files`` TFRecord files ``folder/name-NN.tfrecord``, consecutive rows per file."""
    import tensorflow as tf

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for part, rows in enumerate(np.array_split(np.arange(len(labels)), files)):
        path = folder / f"{name}-{part:02d}.tfrecord"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for row in rows:
                writer.write(_example(images[row], int(labels[row])))
        paths.append(path)
    return paths


def _example(image: np.ndarray, label: int) -> bytes:
    import tensorflow as tf

    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
               "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
