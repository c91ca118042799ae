"""A keras.io-style structured-data classifier: named feature groups as dict inputs, per-group
normalisation, ``validation_split`` and ``class_weight``, trained data-parallel.

    mpirun -n 3 --bind-to none python examples/structured_data_classification.py [--epochs 20]

The data are scikit-learn's breast-cancer table (569 rows, 30 measurements; no download). As in
keras.io's "Structured data classification" examples, each group of features enters the model by
its own named input, is normalised with statistics adapted on the training rows, and the groups
are concatenated into a small dense classifier. The script is a plain Keras script but for
``mpi_trainer.init()`` and ``mpi_trainer.fit(model, ...)``.
"""

import argparse

import mpi_trainer

placed = mpi_trainer.init()

import keras  # noqa: E402 - after init()
import numpy as np  # noqa: E402
from sklearn.datasets import load_breast_cancer  # noqa: E402

GROUPS = ("mean", "error", "worst")  # the table's three blocks of ten measurements


def load():
    table = load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(table.target))  # validation_split takes the last rows
    features = {group: table.data[order, 10 * i:10 * (i + 1)].astype("float32") for i, group in enumerate(GROUPS)}
    labels = (table.target[order] == 0).astype("int64")  # 1 = malignant, the minority class
    return features, labels


def build(features, training_rows):
    inputs, encoded = {}, []
    for group in GROUPS:
        inputs[group] = keras.Input((10,), name=group)
        normalise = keras.layers.Normalization(name=f"normalise_{group}")
        normalise.adapt(features[group][:training_rows])
        encoded.append(normalise(inputs[group]))
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.concatenate(encoded))
    hidden = keras.layers.Dropout(0.3)(hidden)
    output = keras.layers.Dense(1, activation="sigmoid")(hidden)
    model = keras.Model(inputs, output)
    model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy",
                  metrics=["accuracy", keras.metrics.Recall(name="recall")])
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    features, labels = load()
    training_rows = int(len(labels) * 0.8)
    model = build(features, training_rows)
    positives = labels[:training_rows].mean()
    class_weight = {0: 0.5 / (1 - positives), 1: 0.5 / positives}  # balanced
    history = mpi_trainer.fit(model, features, labels, batch_size=16, epochs=args.epochs, validation_split=0.2,
                              class_weight=class_weight, verbose=0)
    scores = model.evaluate({g: f[training_rows:] for g, f in features.items()}, labels[training_rows:],
                            verbose=0, return_dict=True)  # the same on every rank
    if placed.is_scheduler:
        print(f"val_recall per round: {[round(r, 3) for r in history.history['val_recall']]}")
        print(f"held-out rows: accuracy {scores['accuracy']:.3f}, recall {scores['recall']:.3f}", flush=True)


if __name__ == "__main__":
    main()
