#!/usr/bin/env python3
"""How often ``model.fit`` returns late: Keras' own array pipeline against the worker's feed.

A worker calls ``fit`` for one epoch every round. On the TensorFlow backend,
``fit(x, y, shuffle=True)`` builds an autotuned tf.data pipeline, and deleting it
when ``fit`` returns can wait for tf.data's autotuning thread. This script runs
``--rounds`` one-epoch fits of the quick-start MLP on ``--rows`` digits rows,
each batch followed by ``--batch-delay`` seconds of simulated work, as
``debug.batch_delay`` does. It does this twice, alternating the two inputs:
Keras' arrays, and :func:`mpi_trainer.data.feed.fit_arguments`. For each it
counts the fits that returned more than ``--late`` seconds after their last
callback (``on_train_end``), and prints the worst such delay.

    .venv/bin/python scripts/bench_fit_teardown.py [--rounds 40] [--batch-delay 0.05]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mpi_trainer.config import DebugConfig, load_config  # noqa: E402
from mpi_trainer.data.feed import fit_arguments  # noqa: E402
from mpi_trainer.data.sources import load_dataset  # noqa: E402
from mpi_trainer.models import build_model  # noqa: E402
from mpi_trainer.worker.slowdown import make_slowdown  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--rows", type=int, default=850)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batch-delay", type=float, default=0.05)
    parser.add_argument("--late", type=float, default=0.2)
    args = parser.parse_args()
    import keras

    class LastCallback(keras.callbacks.Callback):
        def on_train_end(self, logs=None) -> None:
            self.ended = time.perf_counter()

    cfg = load_config("configs/quickstart.toml", [])
    dataset = load_dataset(cfg.data, 0)
    model, _ = build_model(cfg.model, dataset.input_shape, dataset.num_outputs)
    x, y = dataset.train.read(np.arange(args.rows))
    slowdown, last = make_slowdown(DebugConfig(batch_delay=args.batch_delay), 1), LastCallback()
    rng = np.random.default_rng(0)
    inputs = {
        "keras arrays (fit(x, y, shuffle=True))": lambda: {"x": x, "y": y, "batch_size": args.batch_size,
                                                            "shuffle": True},
        "mpi_trainer feed (fit_arguments)": lambda: fit_arguments(x, y, args.batch_size, rng),
    }
    delays: dict[str, list[float]] = {name: [] for name in inputs}
    for _ in range(args.rounds):
        for name, arguments in inputs.items():
            model.fit(**arguments(), epochs=1, verbose=0, callbacks=[slowdown, last])
            delays[name].append(time.perf_counter() - last.ended)
    print(f"{args.rounds} one-epoch fits each, {args.rows} rows, batch {args.batch_size}, "
          f"{args.batch_delay * 1000:g} ms of simulated work per batch")
    print(f"{'input':<42} {'late fits':>9} {'worst delay s':>14} {'median delay s':>15}")
    for name, values in delays.items():
        late = sum(value > args.late for value in values)
        print(f"{name:<42} {late:>9} {max(values):>14.3f} {float(np.median(values)):>15.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
