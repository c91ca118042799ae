"""Plain Keras in one process: the baseline the suites compare mpi_trainer against.

    python -m benchmarks.plain_keras [--config C] [--set KEY=VALUE ...] [--epochs 6] [--threads 0]
        [--feed arrays|tfdata] [--seed 0]
    python -m benchmarks.plain_keras ... --steps 40      # a train_on_batch loop instead of fit

Builds the model a config describes on the data it names, with mpi_trainer's own loaders and model
zoo, so both sides see identical arrays and layers. ``fit`` scores the test split after every epoch
(``validation_data``, as a round is scored). ``--feed tfdata`` feeds ``fit`` a tf.data pipeline
without autotuning instead of the arrays. It prints one JSON line of figures.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def epoch_clock(started: float) -> tuple[Any, list[dict[str, float]]]:
    """A callback recording each epoch's seconds (its scoring included) and the time and test
    accuracy at its end, counted from ``started``."""
    import keras

    rows: list[dict[str, float]] = []
    begun: dict[str, float] = {}

    def begin(epoch: int, logs: Any = None) -> None:
        begun["at"] = time.perf_counter()

    def end(epoch: int, logs: Any = None) -> None:
        now = time.perf_counter()
        rows.append({"seconds": now - begun["at"], "elapsed": now - started,
                     "accuracy": float((logs or {}).get("val_accuracy", float("nan")))})

    return keras.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end), rows


def tf_data_feed(x: Any, y: Any, batch: int, seed: int) -> Any:
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=seed).batch(batch).prefetch(1)
            .with_options(options))


def setup(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import keras

    from mpi_trainer.config import load_config
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.launch.runtime import configure_threads
    from mpi_trainer.models import build_model

    if args.threads:
        configure_threads(args.threads)
    cfg = load_config(args.config, [*args.set, f"train.seed={args.seed}"])
    data = load_dataset(cfg.data, args.seed)
    keras.utils.set_random_seed(args.seed)
    model = build_model(cfg.model, data.input_shape, data.num_outputs, data.classes)
    return cfg, data, model


def fit(args: argparse.Namespace) -> dict[str, Any]:
    cfg, data, model = setup(args)
    batch = cfg.train.batch_size
    started = time.perf_counter()
    clock, rows = epoch_clock(started)
    feed = (tf_data_feed(data.x_train, data.y_train, batch, args.seed) if args.feed == "tfdata"
            else data.x_train)
    labels = None if args.feed == "tfdata" else data.y_train
    model.fit(feed, labels, batch_size=None if args.feed == "tfdata" else batch, epochs=args.epochs, verbose=0,
              validation_data=(data.x_test, data.y_test), callbacks=[clock])
    steady = rows[1:] or rows  # the first epoch traces the graphs
    per_epoch = sum(row["seconds"] for row in steady) / len(steady)
    return {"samples_per_second": len(data.x_train) / per_epoch, "seconds_per_epoch": per_epoch,
            "final_test_accuracy": rows[-1]["accuracy"], "best_test_accuracy": max(r["accuracy"] for r in rows),
            "curve": [(row["elapsed"], row["accuracy"]) for row in rows], "parameters": model.count_params()}


def loop(args: argparse.Namespace, warmup: int = 5) -> dict[str, Any]:
    """``train_on_batch`` on random batches: seconds per step after ``warmup`` steps."""
    import numpy as np

    cfg, data, model = setup(args)
    rng = np.random.default_rng(args.seed)
    for step in range(warmup + args.steps):
        if step == warmup:
            started = time.perf_counter()
        rows = rng.choice(len(data.x_train), cfg.train.batch_size, replace=False)
        model.train_on_batch(data.x_train[rows], data.y_train[rows])
    return {"step_seconds": (time.perf_counter() - started) / args.steps, "parameters": model.count_params()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quickstart.toml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--threads", type=int, default=0, help="0 = the backend's default pools")
    parser.add_argument("--feed", choices=["arrays", "tfdata"], default="arrays")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=0, help="a train_on_batch loop of this many timed steps")
    args = parser.parse_args()
    print(json.dumps(loop(args) if args.steps else fit(args)))


if __name__ == "__main__":
    main()
