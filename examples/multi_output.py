"""A keras.io-style multi-output functional model: one image, two heads (the digit, and whether it is even),
each with its own loss, loss weight and metrics, trained data-parallel.

    mpirun -n 3 --bind-to none python examples/multi_output.py [--epochs 20]

The data are scikit-learn's handwritten digits (1,797 images of 8x8 pixels; no download). As in
keras.io's "multi-input and multi-output models" guide, the targets are given to ``fit`` as a dict
keyed by the output layers' names, and Keras reports every output's loss and metrics under its name
(``digit_loss``, ``even_accuracy``, ``val_digit_accuracy``...). The script is a plain Keras script
but for ``mpi_trainer.init()`` and ``mpi_trainer.fit(model, ...)``; what follows ``fit`` runs on
every rank.
"""

import argparse

import mpi_trainer

placed = mpi_trainer.init()

import keras  # noqa: E402 - after init()
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

TEST_ROWS = 297  # the last images, kept out of training for model.evaluate


def load():
    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    images = (digits.images[order] / 16.0).reshape(-1, 64).astype("float32")
    labels = digits.target[order].astype("int64")
    targets = {"digit": labels, "even": (labels % 2 == 0).astype("float32")}
    return images, targets


def build():
    pixels = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(64, activation="relu")(pixels)
    hidden = keras.layers.Dense(32, activation="relu")(hidden)
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(hidden)
    even = keras.layers.Dense(1, activation="sigmoid", name="even")(hidden)
    model = keras.Model(pixels, [digit, even])
    model.compile(optimizer=keras.optimizers.Adam(0.005),
                  loss={"digit": "sparse_categorical_crossentropy", "even": "binary_crossentropy"},
                  loss_weights={"digit": 1.0, "even": 0.5},
                  metrics={"digit": ["accuracy"], "even": ["accuracy", keras.metrics.AUC(name="auc")]})
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    images, targets = load()
    train = slice(0, len(images) - TEST_ROWS)
    test = slice(len(images) - TEST_ROWS, None)
    keras.utils.set_random_seed(0)  # the same initial weights on every run
    model = build()
    history = mpi_trainer.fit(model, images[train], {name: y[train] for name, y in targets.items()},
                              batch_size=32, epochs=args.epochs, validation_split=0.2, verbose=0)
    scores = model.evaluate(images[test], {name: y[test] for name, y in targets.items()},
                            verbose=0, return_dict=True)  # the same on every rank
    print(f"rank {placed.rank}: history keys {sorted(history.history)}", flush=True)
    if placed.is_scheduler:
        print(f"val_digit_accuracy per round: {[round(a, 3) for a in history.history['val_digit_accuracy']]}")
        print(f"held-out images: digit accuracy {scores['digit_accuracy']:.3f}, "
              f"even accuracy {scores['even_accuracy']:.3f}, even auc {scores['even_auc']:.3f}", flush=True)


if __name__ == "__main__":
    main()
