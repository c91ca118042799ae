"""class_weight on an imbalanced task: minority-class recall of mpi_trainer.fit against plain Keras model.fit.

    mpirun -n 3 --oversubscribe --bind-to none python scripts/bench_class_weight.py [--seeds 3] [--epochs 30]

The task: scikit-learn's digits as "is it a 7, 8 or 9?", with those digits cut to a fifth of their
number (about 7 % positives), split 70/30 stratified. The same small network is trained with and without
``class_weight`` (the balanced weights, n / (2 n_class)) by ``mpi_trainer.fit`` (2 workers, batch
16 each) and, on rank 0 afterwards, by plain ``model.fit`` (batch 32, the same global batch); both
report recall and precision of the positives on the test rows. Rank 0 prints one JSON line per seed
and a mean table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mpi_trainer  # noqa: E402

placed = mpi_trainer.init(threads=1)

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

POSITIVE = (7, 8, 9)
KEEP_POSITIVES = 0.2


def imbalanced_digits(seed: int) -> tuple[np.ndarray, ...]:
    """Digits as 'is it a 7, 8 or 9', with 80 % of those dropped; a stratified 70/30 split."""
    x, digit = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    positive = np.isin(digit, POSITIVE)
    keep = ~positive | (rng.random(len(digit)) < KEEP_POSITIVES)
    x, y = x[keep] / 16.0, positive[keep].astype(np.int64)
    return train_test_split(x.astype(np.float32), y, test_size=0.3, stratify=y, random_state=seed)


def network(seed: int) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1, activation="sigmoid")])
    model.compile(keras.optimizers.Adam(0.003), "binary_crossentropy", metrics=["accuracy"])
    return model


def scores(model: keras.Model, x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    predicted = (model.predict(x, verbose=0).ravel() >= 0.5).astype(np.int64)
    hits = int(np.sum((predicted == 1) & (y == 1)))
    return {"recall": hits / max(1, int(y.sum())), "precision": hits / max(1, int(predicted.sum()))}


def one_seed(seed: int, epochs: int) -> dict[str, dict[str, float]] | None:
    x_train, x_test, y_train, y_test = imbalanced_digits(seed)
    positives = float(y_train.mean())
    balanced = {0: 0.5 / (1 - positives), 1: 0.5 / positives}
    out = {}
    for name, class_weight in (("none", None), ("balanced", balanced)):
        model = network(seed)
        mpi_trainer.fit(model, x_train, y_train, batch_size=16, epochs=epochs, class_weight=class_weight,
                        overrides={"log.plots": False, "log.tensorboard": False, "log.verbosity": 0})
        out[f"mpi_trainer {name}"] = scores(model, x_test, y_test)
    if not placed.is_scheduler:
        return None
    for name, class_weight in (("none", None), ("balanced", balanced)):
        model = network(seed)
        model.fit(x_train, y_train, batch_size=32, epochs=epochs, class_weight=class_weight, verbose=0)
        out[f"keras {name}"] = scores(model, x_test, y_test)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    results = []
    for seed in range(args.seeds):
        result = one_seed(seed, args.epochs)
        if result is not None:
            print(json.dumps({"seed": seed, **result}), flush=True)
            results.append(result)
    if results:
        print(f"{'run':24} {'recall':>7} {'precision':>9}   (mean of {len(results)} seeds, {args.epochs} epochs)")
        for key in results[0]:
            recall = np.mean([r[key]["recall"] for r in results])
            precision = np.mean([r[key]["precision"] for r in results])
            print(f"{key:24} {recall:7.3f} {precision:9.3f}")


if __name__ == "__main__":
    main()
