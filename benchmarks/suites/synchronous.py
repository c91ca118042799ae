"""Synchronous SGD: epochs and time to accuracy against MultiWorkerMirroredStrategy and one process on the global
batch, and what the per-step sum costs against averaging once an epoch."""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import seeded
from benchmarks.suites.accuracy import ADAM, ADAM_BATCH, mwms, one_process, trainer, with_mwms

QUESTION = ("Synchronous SGD: does `aggregation.method = \"synchronous\"` converge per epoch as one process on the "
            "global batch, and in how much of MultiWorkerMirroredStrategy's time?")
STEPS = -(-4000 // (2 * ADAM_BATCH))  # each worker's steps an epoch: 2,000 of the 4,000 training digits, by 128


def global_batch(epochs: int, target: float, seed: int) -> Figures:
    """One process training on both workers' batches at once: LeNet, Adam 1e-3, batch 256."""
    settings = [item for item in ADAM if not item.startswith("train.batch_size")] + \
        [f"train.batch_size={2 * ADAM_BATCH}"]
    return one_process(settings, epochs, target, seed)


def comparisons(quick: bool) -> list[Comparison]:
    epochs, target = (4, 0.95) if quick else (10, 0.96)
    variants = {
        "plain Keras, one process, batch 256 (the global batch)": seeded(
            lambda seed: global_batch(epochs, target, seed)),
        "mpi_trainer, 2 workers, `aggregation.method = \"synchronous\"`": seeded(lambda seed: trainer(
            2, 0, epochs, target, seed, ("aggregation.method=synchronous",), setting=tuple(ADAM))),
        "mpi_trainer, 2 workers, defaults (averaged once an epoch)": seeded(lambda seed: trainer(
            2, 0, epochs, target, seed, setting=tuple(ADAM))),
        "mpi_trainer, 2 workers, averaged once an epoch, `aggregation.optimizer_state = \"local\"`": seeded(
            lambda seed: trainer(2, 0, epochs, target, seed, ("aggregation.optimizer_state=local",),
                                 setting=tuple(ADAM))),
    }
    notes = (f"Each worker takes {STEPS} steps of 128 rows an epoch. Synchronous SGD sums the two workers' "
             "gradients at every step, so its epochs should reach the target as one process on batches of 256 "
             "does and as MultiWorkerMirroredStrategy does; its seconds per epoch against the defaults' are the "
             f"cost of {STEPS + 1} sums an epoch (the steps, and the closing one). `optimizer_state = \"local\"` "
             "keeps each worker's Adam moments on the worker: a third of the state travels. MB an epoch are "
             "mpi_trainer's own count (rounds.csv). Seeds 0, 1, 2 (initial weights and shuffle); a cell is the "
             "median over seeds.")
    title = (f"LeNet on 5,000 real MNIST digits, Adam 1e-3, batch {ADAM_BATCH} per worker, 2 workers: synchronous "
             f"SGD, time and epochs to {target}")
    return [with_mwms(title, quick, target, variants, notes, lambda seed: mwms(
        epochs, target, seed, optimizer="adam", rate=0.001, batch=ADAM_BATCH), suite="synchronous", traffic=True)]
