"""How long to a test accuracy: mpi_trainer against plain Keras and MultiWorkerMirroredStrategy?"""

from __future__ import annotations

import importlib.util
import json
import socket
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from benchmarks.data import mnist5k
from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import (
    ENV,
    MNIST_LENET,
    JobFailed,
    after_first,
    curve,
    epochs_to,
    program,
    run_job,
    seeded,
    time_to,
)

QUESTION = "Time to accuracy: LeNet on real MNIST against plain Keras and MultiWorkerMirroredStrategy"
BATCH = 64
# LeNet with Adadelta at 1.0, as configs/mnist_lenet.toml, every run scored after every epoch.
LENET = ["data.validation_size=0.0", "model.name=lenet", "model.optimizer=adadelta", "model.learning_rate=1.0",
         f"train.batch_size={BATCH}"]
# Against MultiWorkerMirroredStrategy as its users set it up: Adam at 1e-3, 128 rows a step on each worker.
ADAM_BATCH = 128
ADAM = ["data.validation_size=0.0", "model.name=lenet", "model.optimizer=adam", "model.learning_rate=0.001",
        f"train.batch_size={ADAM_BATCH}"]


def figures(result: dict, target: float) -> Figures:
    points = [tuple(p) for p in result["curve"]]
    return {"samples_per_second": result["samples_per_second"], "seconds_per_epoch": result["seconds_per_epoch"],
            "seconds_to_target": time_to(points, target), "epochs_to_target": epochs_to(points, target),
            "best_test_accuracy": result["best_test_accuracy"]}


def plain(feed: str, epochs: int, target: float, seed: int) -> Figures:
    sets = [x for item in [f"data.source={mnist5k()}", *LENET] for x in ("--set", item)]
    return figures(program("plain_keras", ["--config", MNIST_LENET, *sets, "--epochs", str(epochs),
                                           "--feed", feed, "--seed", str(seed)]), target)


def one_process(settings: list[str], epochs: int, target: float, seed: int,
                data: Callable[[], Path] = mnist5k) -> Figures:
    """Plain Keras in one process on ``data`` with the config's ``settings`` (``--set`` items)."""
    sets = [x for item in [f"data.source={data()}", *settings] for x in ("--set", item)]
    return figures(program("plain_keras", ["--config", MNIST_LENET, *sets, "--epochs", str(epochs),
                                           "--seed", str(seed)]), target)


def trainer(workers: int, threads: int, epochs: int, target: float, seed: int, extra: tuple[str, ...] = (),
            setting: tuple[str, ...] = tuple(LENET), data: Callable[[], Path] = mnist5k) -> Figures:
    overrides = [f"data.source={data()}", *setting, f"train.epochs={epochs}", f"train.threads={threads}",
                 f"train.seed={seed}", "checkpoint.every=0", "log.plots=false", "log.tensorboard=false", *extra]
    summary, rounds, _ = run_job(workers + 1, overrides, config=MNIST_LENET)
    elapsed = [float(row["elapsed_seconds"]) for row in rounds]
    points = curve(rounds)
    return {"samples_per_second": sum(after_first(rounds, "samples")) / sum(after_first(rounds, "train_seconds_max")),
            "seconds_per_epoch": (elapsed[-1] - elapsed[0]) / max(1, len(elapsed) - 1),
            "seconds_to_target": time_to(points, target), "epochs_to_target": epochs_to(points, target),
            "best_test_accuracy": max(a for _, a in points),
            "megabytes_per_epoch": statistics.median(float(row["bytes"]) for row in rounds) / 1e6}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def mwms(epochs: int, target: float, seed: int, workers: int = 2, optimizer: str = "adadelta", rate: float = 1.0,
         batch: int = BATCH, model: str = "lenet", data: Callable[[], Path] = mnist5k) -> Figures:
    """Two tf_keras processes on localhost under MultiWorkerMirroredStrategy (the chief's figures)."""
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(workers)]}
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.mwms", str(data()), "--epochs", str(epochs),
                               "--batch", str(batch), "--seed", str(seed), "--optimizer", optimizer,
                               "--learning-rate", str(rate), "--model", model], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**ENV, "TF_USE_LEGACY_KERAS": "1", "TF_CONFIG": json.dumps(
                                  {"cluster": cluster, "task": {"type": "worker", "index": index}})})
             for index in range(workers)]
    outputs = [proc.communicate(timeout=3600) for proc in procs]
    if any(proc.returncode for proc in procs):
        raise JobFailed("MultiWorkerMirroredStrategy failed:\n" + "\n".join(err[-2000:] for _, err in outputs))
    return figures(json.loads(outputs[0][0].strip().splitlines()[-1]), target)


def comparisons(quick: bool) -> list[Comparison]:
    epochs, target = (4, 0.95) if quick else (8, 0.96)
    variants = {
        "plain Keras, `fit(x, y)` on arrays": seeded(lambda seed: plain("arrays", epochs, target, seed)),
        "plain Keras, `fit` on a tf.data feed": seeded(lambda seed: plain("tfdata", epochs, target, seed)),
        "mpi_trainer, 1 worker": seeded(lambda seed: trainer(1, 0, epochs, target, seed)),
        "mpi_trainer, 2 workers, outer `none`": seeded(lambda seed: trainer(
            2, 0, epochs, target, seed, ("aggregation.outer_optimizer=none",))),
        "mpi_trainer, 2 workers, outer `nesterov`": seeded(lambda seed: trainer(
            2, 0, epochs, target, seed, ("aggregation.outer_optimizer=nesterov",))),
        "mpi_trainer, 1 worker at `train.threads = 1`": seeded(lambda seed: trainer(1, 1, epochs, target, seed)),
    }
    notes = ("Repeat n runs with seed n (initial weights and shuffle), so a cell is the median over seeds; "
             "the epoch that first reaches a target depends on the seed as much as on the method. Samples/s "
             "leave out the first epoch (graph tracing). The 1-thread worker is what each of two workers gets "
             "on 2 cores: two workers' samples/s over twice its own is the 2-worker efficiency.")
    title = (f"LeNet (484,714 parameters) on 5,000 real MNIST digits, {epochs} epochs = rounds, batch {BATCH} "
             f"per worker, Adadelta; target test accuracy {target}")
    return [with_mwms(title, quick, target, variants, notes, lambda seed: mwms(epochs, target, seed)),
            against_mwms(quick)]


def with_mwms(title: str, quick: bool, target: float, variants: dict, notes: str,
              baseline: Callable[[int], Figures], suite: str = "accuracy", traffic: bool = False) -> Comparison:
    """A time-to-accuracy comparison of ``suite``, with MultiWorkerMirroredStrategy's run (``baseline``) where
    tf_keras is installed, said to be left out where it is not; ``traffic``: with mpi_trainer's MB an epoch."""
    if importlib.util.find_spec("tf_keras") is not None:
        variants["MultiWorkerMirroredStrategy, 2 processes (tf_keras)"] = seeded(baseline)
    else:
        notes += " MultiWorkerMirroredStrategy is left out: it needs tf_keras (`pip install -e .[bench]`)."
    columns = {"samples_per_second": "train samples/s", "seconds_per_epoch": "s per epoch + scoring",
               "seconds_to_target": f"s to {target}", "epochs_to_target": f"epochs to {target}",
               "best_test_accuracy": "best test accuracy"}
    if traffic:
        columns["megabytes_per_epoch"] = "MB moved an epoch (every rank's sends)"
    return Comparison(title=title, command=f"python -m benchmarks run {suite}{' --quick' if quick else ''}",
                      variants=variants, columns=columns, notes=notes)


def against_mwms(quick: bool) -> Comparison:
    """Time to 96 % against MultiWorkerMirroredStrategy with Adam at 1e-3 and 128 rows a step on each of 2
    workers, mpi_trainer at its defaults otherwise (one round an epoch, the outer optimizer ``auto``)."""
    epochs, target = (4, 0.95) if quick else (12, 0.96)
    variants = {"mpi_trainer, 2 workers, defaults": seeded(lambda seed: trainer(
        2, 0, epochs, target, seed, setting=tuple(ADAM))),
                "mpi_trainer, 2 workers, outer `none`": seeded(lambda seed: trainer(
                    2, 0, epochs, target, seed, ("aggregation.outer_optimizer=none",), setting=tuple(ADAM))),
                "mpi_trainer, 2 workers, `train.overlap_eval`": seeded(lambda seed: trainer(
                    2, 0, epochs, target, seed, ("train.overlap_eval=true",), setting=tuple(ADAM))),
                "mpi_trainer, 2 workers, outer `none`, `train.overlap_eval`": seeded(lambda seed: trainer(
                    2, 0, epochs, target, seed, ("aggregation.outer_optimizer=none", "train.overlap_eval=true"),
                    setting=tuple(ADAM)))}
    notes = ("Both on the same cores, each worker with its own 128 rows a step (MultiWorkerMirroredStrategy's "
             "global batch 256); seconds from each one's first epoch's start, scored on the test split after "
             "every epoch. `train.overlap_eval`: rank 0 scores each epoch while the workers train the next.")
    title = (f"LeNet on 5,000 real MNIST digits, Adam 1e-3, batch {ADAM_BATCH} per worker, 2 workers: time to "
             f"{target} against MultiWorkerMirroredStrategy")
    return with_mwms(title, quick, target, variants, notes, lambda seed: mwms(
        epochs, target, seed, optimizer="adam", rate=0.001, batch=ADAM_BATCH))
