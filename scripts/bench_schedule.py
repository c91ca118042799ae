"""Sync schedules side by side: time to accuracy against plain Keras, steps/s against MultiWorkerMirroredStrategy.

``accuracy``: LeNet on the same images as ``scripts/bench.py`` (digits upsampled to 28x28, or
``--data mnist5k`` for 5,000 real MNIST digits, or a file), batch 64, Adadelta, the same number
of passes over the training set for every run:

* plain Keras in one process, ``fit`` on arrays and on a tf.data feed (scripts/bench.py's two);
* mpi_trainer, 2 workers, averaging once per local epoch (``train.sync_every = 0``);
* mpi_trainer, 2 workers, post-local SGD: a warm-up of ``train.sync_warmup_epochs`` local epochs at
  ``train.sync_warmup_every`` steps per round, then once per local epoch; the same with every
  worker's optimizer state reset at each averaging (``debug.reset_optimizer``); and, for reference,
  averaging after every step throughout.

Every run is scored on the test split once per pass over the data (plain Keras after each epoch,
mpi_trainer at each round that ends a local epoch), and "s to target" is the elapsed training time
of the first such score at or above the target. "epochs" is passes over the training set by then.
Which epoch first crosses a target depends on the seed as much as on the method, so ``--seeds N``
repeats every run with seeds 0..N-1 (plain Keras: its initial weights and shuffle; mpi_trainer:
``train.seed``) and compares the median times.

``steps``: synchronous SGD on both sides, 2 workers (2 processes) of batch 64: mpi_trainer at
``train.sync_every = 1`` (scored only at the end, ``train.overlap_eval``, ``comm.poll_interval =
0.001``, the settings README recommends at k = 1) against ``tf.distribute.MultiWorkerMirroredStrategy``
(tf_keras, global batch 128), both plain SGD. Steps per second exclude the first epoch's worth
of steps (graph tracing) and, for mpi_trainer, the last round (which is scored).

    .venv/bin/python scripts/bench_schedule.py accuracy [--data mnist5k] [--epochs 8] [--targets 0.95 0.96]
        [--seeds 3] [--only "per-epoch averaging" ...]
    .venv/bin/python scripts/bench_schedule.py steps [--epochs 6]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path

import bench
from benchlib import run_job

from mpi_trainer.algorithms.sync_schedule import SyncSchedule
from mpi_trainer.data.partition import block_bounds

WORKERS = 2
COMMON = ["data.validation_size=0.0", "model.name=lenet", f"train.batch_size={bench.BATCH}", "checkpoint.every=0",
          "log.verbosity=0", "log.plots=false", "log.tensorboard=false"]
ADADELTA = ["model.optimizer=adadelta", "model.learning_rate=1.0"]


def warmup_rounds(num_train: int, warmup_epochs: int, warmup_every: int) -> int:
    """The rounds a warm-up lasts on these blocks, as the scheduler computes them."""
    sizes = [end - start for start, end in block_bounds(num_train, WORKERS)]
    return SyncSchedule.plan(0, warmup_epochs, warmup_every, sizes, bench.BATCH).warmup_rounds


def variants(num_train: int, epochs: int) -> dict[str, list[str]]:
    """Name -> overrides, each for ``epochs`` passes over the training set."""
    per_epoch = warmup_rounds(num_train, 1, 1)
    quarters = per_epoch // 4  # rounds of 4 steps per local epoch (the bench's blocks: 12 steps)

    def warmup(n: int, k: int) -> list[str]:
        rounds = warmup_rounds(num_train, n, k)
        return [f"train.sync_warmup_epochs={n}", f"train.sync_warmup_every={k}", f"train.epochs={rounds + epochs - n}"]

    return {
        "per-epoch averaging": [f"train.epochs={epochs}"],
        "warm-up 1 epoch, every step": warmup(1, 1),
        "warm-up 1 epoch, every 2 steps": warmup(1, 2),
        "warm-up 2 epochs, every step": warmup(2, 1),
        "warm-up 1 epoch, every step, then every 4 steps": [
            *warmup(1, 1)[:2], "train.sync_every=4", f"train.epochs={per_epoch + (epochs - 1) * quarters}",
            f"evaluation.every={quarters}"],
        "warm-up 1 epoch, every step, optimizer reset": [*warmup(1, 1), "debug.reset_optimizer=true"],
        "every step throughout": ["train.sync_every=1", f"train.epochs={per_epoch * epochs}",
                                  f"evaluation.every={per_epoch}"],
    }


def trainer_rows(data: Path, name: str, overrides: list[str], scratch: Path, num_train: int) -> list[dict]:
    """One mpi_trainer run's scored rounds: elapsed seconds, test accuracy, passes over the data."""
    run_dir = scratch / name.replace(" ", "_").replace(",", "")
    _, rounds = run_job(WORKERS + 1, "configs/mnist_lenet.toml",
                        [f"data.source={data}", *COMMON, *ADADELTA, *overrides], run_dir)
    scored = [r for r in rounds if not math.isnan(float(r["test_accuracy"]))]
    epoch_steps = sum(math.ceil((end - start) / bench.BATCH) for start, end in block_bounds(num_train, WORKERS))
    return [{"elapsed": float(r["elapsed_seconds"]), "test_accuracy": float(r["test_accuracy"]),
             "epochs": int(r["steps"]) / epoch_steps, "rounds": int(r["round"]) + 1} for r in scored]


def plain_rows(data: Path, feed: str, epochs: int, seed: int = 0) -> list[dict]:
    rows = bench.epochs_of(bench.child(["--plain", feed, str(data), "--epochs", str(epochs), "--seed", str(seed)]))
    return [{**r, "epochs": r["epoch"] + 1, "rounds": r["epoch"] + 1} for r in rows]


def first_reaching(rows: list[dict], target: float) -> dict | None:
    return next((r for r in rows if r["test_accuracy"] >= target), None)


def accuracy_table(results: dict[str, list[dict]], targets: list[float]) -> str:
    plain_hits = {t: [first_reaching(results[f"plain-{feed}"], t) for feed in ("arrays", "tfdata")] for t in targets}
    best = {t: min((hit["elapsed"] for hit in hits if hit), default=None) for t, hits in plain_hits.items()}
    head = " | ".join(f"s to {t} | epochs | ratio" for t in targets)
    out = [f"| run | {head} | best test accuracy |", "|---|" + "---|---|---|" * len(targets) + "---|"]
    for name, rows in results.items():
        cells = []
        for t in targets:
            hit = first_reaching(rows, t)
            ratio = f"**{hit['elapsed'] / best[t]:.2f}**" if hit and best[t] else ""
            cells.append(f"{hit['elapsed']:.1f} | {hit['epochs']:.1f} | {ratio}" if hit else "not reached | |")
        out.append(f"| {name} | {' | '.join(cells)} | {max(r['test_accuracy'] for r in rows):.4f} |")
    return "\n".join(out) + "\n\nratio = time to the target / the faster plain Keras run's time to it"


def accuracy(data: Path, epochs: int, targets: list[float], only: list[str] | None, scratch: Path,
             seeds: int = 1) -> None:
    num_train = len(bench.load(data)[1])
    chosen = {name: o for name, o in variants(num_train, epochs).items() if only is None or name in only}
    runs: dict[str, list[list[dict]]] = {}
    for seed in range(seeds):  # every run of one seed, then the next: a slow spell hits all alike
        for feed in ("arrays", "tfdata"):
            runs.setdefault(f"plain-{feed}", []).append(plain_rows(data, feed, epochs, seed))
        for name, overrides in chosen.items():
            rows = trainer_rows(data, f"{name} {seed}", [*overrides, f"train.seed={seed}"], scratch, num_train)
            runs.setdefault(name, []).append(rows)
            print(f"{name}, seed {seed}: {[round(r['test_accuracy'], 4) for r in rows]}", flush=True)
    if seeds == 1:
        print(accuracy_table({name: rows[0] for name, rows in runs.items()}, targets))
    else:
        print(median_table(runs, targets))


def median_table(runs: dict[str, list[list[dict]]], targets: list[float]) -> str:
    """Per run and target: the median over seeds of the time to it (a seed that never reaches it counts as
    longer than any that does), its ratio to the faster plain Keras feed's median, and each seed's time."""

    def times(name: str, target: float) -> list[float]:
        return [hit["elapsed"] if (hit := first_reaching(rows, target)) else math.inf for rows in runs[name]]

    best = {t: min(statistics.median(times(f"plain-{feed}", t)) for feed in ("arrays", "tfdata")) for t in targets}
    head = " | ".join(f"median s to {t} | ratio | each seed" for t in targets)
    out = [f"| run | {head} |", "|---|" + "---|---|---|" * len(targets)]
    for name in runs:
        cells = []
        for t in targets:
            each, median = times(name, t), statistics.median(times(name, t))
            ratio = f"**{median / best[t]:.2f}**" if math.isfinite(median) and math.isfinite(best[t]) else ""
            shown = "; ".join("-" if math.isinf(v) else f"{v:.1f}" for v in each)
            cells.append(f"{median:.1f} | {ratio} | {shown}" if math.isfinite(median) else f"not reached | | {shown}")
        out.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(out) + ("\n\nratio = median time to the target / the faster plain Keras feed's median; "
                             "'-': that seed did not reach it")


# -- steps per second at sync_every = 1 ----------------------------------------------------------
def trainer_steps(data: Path, rounds: int, scratch: Path) -> tuple[float, float]:
    """mpi_trainer at k = 1: (global steps per second in the steady rounds, final test accuracy)."""
    overrides = [f"data.source={data}", *COMMON, "model.optimizer=sgd", "model.learning_rate=0.05",
                 "train.sync_every=1", f"train.epochs={rounds}", f"evaluation.every={rounds}",
                 "train.overlap_eval=true", "comm.poll_interval=0.001"]
    _, rows = run_job(WORKERS + 1, "configs/mnist_lenet.toml", overrides, scratch / "k1")
    warm = rounds // 6  # about the first epoch's worth of rounds: graph tracing
    steady = rows[warm:-1]
    seconds = float(steady[-1]["elapsed_seconds"]) - float(rows[warm - 1]["elapsed_seconds"])
    return len(steady) / seconds, float(rows[-1]["test_accuracy"])


def mwms_steps(data: Path, epochs: int) -> tuple[float, float]:
    """MultiWorkerMirroredStrategy: (global steps per second after the first epoch, last test accuracy)."""
    rows = bench.run_mwms(data, epochs, "sgd", 0.05)
    steady = rows[1:]
    steps = sum(math.ceil(r["samples"] / (bench.BATCH * WORKERS)) for r in steady)
    return steps / sum(r["train_seconds"] for r in steady), rows[-1]["test_accuracy"]


def steps(data: Path, epochs: int, scratch: Path) -> None:
    num_train = len(bench.load(data)[1])
    rounds = math.ceil(num_train / (bench.BATCH * WORKERS)) * epochs
    ours, our_accuracy = trainer_steps(data, rounds, scratch)
    theirs, their_accuracy = mwms_steps(data, epochs)
    print(f"| run | global steps/s | samples/s | final test accuracy |\n|---|---|---|---|\n"
          f"| mpi_trainer, train.sync_every = 1, {rounds} rounds | {ours:.2f} | "
          f"{ours * bench.BATCH * WORKERS:.0f} | {our_accuracy:.4f} |\n"
          f"| MultiWorkerMirroredStrategy, {epochs} epochs | {theirs:.2f} | "
          f"{theirs * bench.BATCH * WORKERS:.0f} | {their_accuracy:.4f} |\n\n"
          f"mpi_trainer / MultiWorkerMirroredStrategy steps per second: **{ours / theirs:.2f}x**")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["accuracy", "steps"])
    parser.add_argument("--data", help="mnist5k (real MNIST digits), or a Keras-layout .npz "
                                           "(default: digits upsampled to 28x28)")
    parser.add_argument("--epochs", type=int, default=8, help="passes over the training set per run")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.95, 0.96])
    parser.add_argument("--only", nargs="+", help="accuracy: run only these mpi_trainer variants (by name)")
    parser.add_argument("--seeds", type=int, default=1,
                        help="accuracy: run everything with seeds 0..N-1 and compare median times to the targets")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="mpi_trainer_bench_schedule_"))
    data = bench.bench_data(args.data, scratch)
    print(f"data: {data}", flush=True)
    if args.mode == "accuracy":
        accuracy(data, args.epochs, args.targets, args.only, scratch, args.seeds)
    else:
        steps(data, args.epochs, scratch)


if __name__ == "__main__":
    main()
