"""Horovod's TensorFlow 2 Keras MNIST example, ported to mpi_trainer.

    mpirun -n 3 --bind-to none python examples/horovod_keras_mnist.py [--data mnist.npz] [--epochs 24]

The original is horovod/examples/tensorflow2/tensorflow2_keras_mnist.py (Copyright 2019 Uber
Technologies, Apache License 2.0). docs/api.md's "Coming from Keras or Horovod" shows the diff:
``hvd.init()`` becomes ``mpi_trainer.init()``; the GPU pinning, the DistributedOptimizer, the
broadcast and metric-averaging callbacks and the rank-0 guards go, because mpi_trainer does each
of them itself; ``model.fit`` becomes ``mpi_trainer.fit(model, ...)``. The data are local (no
download): an ``.npz`` in Keras' layout (``x_train``, ``y_train``) or, by default, scikit-learn's
8x8 digits, passed as arrays.
"""

import argparse

import mpi_trainer


def load(path):
    import numpy as np

    if path:
        with np.load(path) as data:
            return data["x_train"], data["y_train"]
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.images * 255 / 16).astype("uint8"), digits.target


def train(data_path, epochs, steps_per_epoch, checkpoint_dir):
    # mpi_trainer: place this rank (its GPU or CPU threads) before Keras starts.
    mpi_trainer.init()

    import tensorflow as tf

    mnist_images, mnist_labels = load(data_path)

    images = tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float32).numpy()
    labels = mnist_labels.astype("int64")

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(32, [3, 3], activation='relu'),
        tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])

    opt = tf.optimizers.Adam(0.001)

    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])

    # mpi_trainer: callbacks run on rank 0, once per round; it writes the checkpoints.
    callbacks = [tf.keras.callbacks.ModelCheckpoint(checkpoint_dir + '/checkpoint-{epoch}.weights.h5',
                                                    save_weights_only=True)]

    # Train the model: batch_size is each worker's batch; steps_per_epoch counts all workers' batches.
    history = mpi_trainer.fit(mnist_model, images, labels, batch_size=128, steps_per_epoch=steps_per_epoch,
                              callbacks=callbacks, epochs=epochs, verbose=1)

    # Return the model (every rank holds the final weights) and its History
    return mnist_model, history


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description="Horovod's Keras MNIST example on mpi_trainer")
    parser.add_argument("--data", help=".npz with x_train, y_train (default: scikit-learn's digits)")
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--steps-per-epoch", type=int, default=None, help="default: one pass over the data")
    parser.add_argument("--checkpoint-dir", default=".")
    args = parser.parse_args()
    model, history = train(args.data, args.epochs, args.steps_per_epoch, args.checkpoint_dir)
    print(f"rank-local check: final training loss {history.history['loss'][-1]:.4f}", flush=True)
