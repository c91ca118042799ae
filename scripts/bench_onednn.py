"""LeNet training throughput with TensorFlow's oneDNN kernels on and off, alternating, on the same cores.

mpi_trainer leaves oneDNN on (TensorFlow's default); this measures what turning it off
(``TF_ENABLE_ONEDNN_OPTS=0``, for bit-repeatable runs) costs.

    .venv/bin/python scripts/bench_onednn.py [--repeats 2] [--epochs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from benchlib import ROOT


def one(epochs: int) -> float:
    """Samples per second of ``fit`` after a first, compiling epoch (runs in a child process)."""
    import numpy as np

    from mpi_trainer.config import ModelConfig
    from mpi_trainer.models import build_model

    x = np.random.default_rng(0).random((1437, 28, 28, 1)).astype("float32")
    y = np.arange(len(x)) % 10
    model, _ = build_model(ModelConfig(name="lenet", optimizer="adadelta", learning_rate=1.0), (28, 28, 1), 10)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    started = time.perf_counter()
    model.fit(x, y, batch_size=64, epochs=epochs, verbose=0)
    return epochs * len(x) / (time.perf_counter() - started)


def run(flag: str, epochs: int) -> float:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": flag}
    out = subprocess.run([sys.executable, __file__, "--child", "--epochs", str(epochs)], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(one(args.epochs))
        return
    rates: dict[str, list[float]] = {"1": [], "0": []}
    for _ in range(args.repeats):
        for flag in rates:
            rates[flag].append(run(flag, args.epochs))
    on, off = statistics.median(rates["1"]), statistics.median(rates["0"])
    print(f"oneDNN on: {on:.0f} samples/s {[round(r) for r in rates['1']]}; "
          f"off: {off:.0f} samples/s {[round(r) for r in rates['0']]}; on / off = {on / off:.2f}")


if __name__ == "__main__":
    main()
