"""``train.bind_cores``: CPU workers each on their own cores, against every rank free to run anywhere.

Two workers (``mpirun -n 3 --bind-to none``, so the job alone decides), LeNet on the real MNIST
digits (or another Keras-layout ``.npz``), batch 64, Adadelta, ``--epochs`` rounds of one local
epoch; the two settings alternate ``--repeats`` times for each Keras backend named. Prints the
median training samples/s (rounds after the first, which compiles) and seconds per round with
its scoring, and their ratios bound / free.

    .venv/bin/python scripts/bench_bind_cores.py [--data mnist5k] [--backends tensorflow jax] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from bench import BATCH, bench_data
from benchlib import run_job


def job(data: Path, backend: str, bind: bool, epochs: int, run_dir: Path) -> tuple[float, float]:
    """Training samples/s and mean wall seconds per round, after round 0."""
    os.environ["KERAS_BACKEND"] = backend
    overrides = [f"data.source='{data}'", "data.validation_size=0.0", "model.name=lenet", "model.optimizer=adadelta",
                 "model.learning_rate=1.0", f"train.epochs={epochs}", f"train.batch_size={BATCH}", "train.device=cpu",
                 f"train.bind_cores={'true' if bind else 'false'}", "checkpoint.every=0", "log.plots=false",
                 "log.verbosity=0"]
    summary, rounds = run_job(3, "configs/mnist_lenet.toml", overrides, run_dir)
    assert all((p["cores"] is not None) == (bind and p["role"] == "worker") for p in summary["placement"]), summary
    steady = rounds[1:]
    rate = sum(int(r["samples"]) for r in steady) / sum(float(r["train_seconds_max"]) for r in steady)
    return rate, statistics.mean(float(r["wall_seconds"]) for r in steady)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="mnist5k", help="mnist5k, or a Keras-layout .npz")
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax"])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = bench_data(args.data, Path(tmp))
        for repeat in range(args.repeats):
            for backend in args.backends:
                for bind in (True, False):
                    run_dir = Path(tmp) / f"{backend}-{bind}-{repeat}"
                    results.setdefault((backend, bind), []).append(job(data, backend, bind, args.epochs, run_dir))
    print(f"2 workers, LeNet, batch {BATCH}, {args.epochs} rounds, {os.cpu_count()} cores, medians of {args.repeats} "
          "alternating runs")
    print("| backend | samples/s bound | samples/s free | ratio | s per round bound | s per round free | ratio |")
    print("|---|---|---|---|---|---|---|")
    for backend in args.backends:
        (rate_b, wall_b), (rate_f, wall_f) = (
            tuple(statistics.median(values) for values in zip(*results[(backend, bind)])) for bind in (True, False))
        print(f"| {backend} | {rate_b:.0f} | {rate_f:.0f} | {rate_b / rate_f:.3f} | {wall_b:.2f} | {wall_f:.2f} | "
              f"{wall_b / wall_f:.3f} |")
    for (backend, bind), values in results.items():
        print(f"{backend} {'bound' if bind else 'free'}: samples/s {', '.join(f'{r:.0f}' for r, _ in values)}; "
              f"s per round {', '.join(f'{w:.2f}' for _, w in values)}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
