"""``class_weight`` on an imbalanced task: minority recall and precision, one training, as JSON.

    mpirun -n 3 python -m benchmarks.class_weight --weights balanced --seed 0    # mpi_trainer.fit, 2 workers
    python -m benchmarks.class_weight --plain --weights balanced --seed 0        # plain Keras model.fit

The task: scikit-learn's digits as "is it a 7, 8 or 9?", with those digits cut to a fifth of their
number (about 7 % positives), split 70/30 stratified. A 64-16-1 network, Adam 0.003, trained with or
without the balanced weights n / (2 n_class): by ``mpi_trainer.fit`` at batch 16 per worker, or by
plain ``model.fit`` at batch 32 (the same global batch for 2 workers). Recall and precision are of
the positives on the test rows; rank 0 (or the one process) prints them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

POSITIVE = (7, 8, 9)
KEEP_POSITIVES = 0.2


def imbalanced_digits(seed: int) -> list[np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, digit = load_digits(return_X_y=True)
    positive = np.isin(digit, POSITIVE)
    keep = ~positive | (np.random.default_rng(seed).random(len(digit)) < KEEP_POSITIVES)
    x, y = (x[keep] / 16.0).astype(np.float32), positive[keep].astype(np.int64)
    return train_test_split(x, y, test_size=0.3, stratify=y, random_state=seed)


def network(seed: int) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(0.003), "binary_crossentropy", metrics=["accuracy"])
    return model


def scores(model: Any, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    predicted = (model.predict(x, verbose=0).ravel() >= 0.5).astype(np.int64)
    hits = int(np.sum((predicted == 1) & (y == 1)))
    return {"recall": hits / max(1, int(y.sum())), "precision": hits / max(1, int(predicted.sum()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", choices=["none", "balanced"], default="none")
    parser.add_argument("--plain", action="store_true", help="plain Keras model.fit in this one process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    placed = None
    if not args.plain:
        import mpi_trainer

        placed = mpi_trainer.init(threads=1)  # before Keras is imported: it sizes the thread pools
    x_train, x_test, y_train, y_test = imbalanced_digits(args.seed)
    positives = float(y_train.mean())
    weights = {0: 0.5 / (1 - positives), 1: 0.5 / positives} if args.weights == "balanced" else None
    model = network(args.seed)
    if placed is None:
        model.fit(x_train, y_train, batch_size=32, epochs=args.epochs, class_weight=weights, verbose=0)
    else:
        import mpi_trainer

        mpi_trainer.fit(model, x_train, y_train, batch_size=16, epochs=args.epochs, class_weight=weights,
                        overrides={"log.plots": False, "log.tensorboard": False, "log.verbosity": 0})
        if not placed.is_scheduler:
            return
    print(json.dumps(scores(model, x_test, y_test)), flush=True)


if __name__ == "__main__":
    main()
