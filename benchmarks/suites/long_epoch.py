"""Time to accuracy when an epoch is long: which way of combining should be the default?

The other accuracy suites train on 5,000 digits, 20 steps a worker an epoch, where averaging once an
epoch lets the workers drift for 20 steps. Here an epoch is 500 steps a worker: the 4,000 real training
digits of ``mnist5k`` in 16 seeded shifted copies (64,000 rows, ``benchmarks.data.shifted_mnist``),
scored on the 1,000 real test digits, with the zoo's two-hidden-layer perceptron (109,386 parameters),
Adam 1e-3, 64 rows a worker a step. Every way of combining runs side by side with
MultiWorkerMirroredStrategy and one process on the global batch, on the same cores.
"""

from __future__ import annotations

from benchmarks.data import shifted_mnist
from benchmarks.harness import Comparison
from benchmarks.jobs import seeded
from benchmarks.suites.accuracy import mwms, one_process, trainer, with_mwms

QUESTION = ("Long epochs (500 steps a worker): time and epochs to accuracy of every way of combining, against "
            "MultiWorkerMirroredStrategy and one process; which should be the default?")
BATCH = 64
ROWS = 64_000
STEPS = ROWS // (2 * BATCH)  # each worker's steps an epoch
SETTING = ("data.validation_size=0.0", "model.name=mlp", "model.optimizer=adam", "model.learning_rate=0.001",
           f"train.batch_size={BATCH}")
# The ways of combining measured, as `--set` items on top of the defaults (named in the table).
WAYS: dict[str, tuple[str, ...]] = {
    "`aggregation.method = \"synchronous\"`": ("aggregation.method=synchronous",),
    "defaults: averaged once an epoch, outer `auto` (Nesterov)": (),
    "averaged once an epoch, outer `none`": ("aggregation.outer_optimizer=none",),
    "averaged once an epoch, `optimizer_state = \"local\"`": ("aggregation.optimizer_state=local",),
    "`train.sync_every = 50`": ("train.sync_every=50",),
    "`train.sync_every = 50`, outer `none`": ("train.sync_every=50", "aggregation.outer_optimizer=none"),
    "`train.sync_every = 50`, `optimizer_state = \"local\"`": ("train.sync_every=50",
                                                               "aggregation.optimizer_state=local"),
    "`train.sync_every = \"auto\"`": ("train.sync_every=auto",),
}


def comparisons(quick: bool) -> list[Comparison]:
    epochs, target = (2, 0.95) if quick else (6, 0.96)
    global_setting = [item for item in SETTING if not item.startswith("train.batch_size")] + \
        [f"train.batch_size={2 * BATCH}"]
    variants = {f"plain Keras, one process, batch {2 * BATCH} (the global batch)": seeded(
        lambda seed: one_process(global_setting, epochs, target, seed, data=shifted_mnist))}
    for name, extra in WAYS.items():
        variants[f"mpi_trainer, 2 workers, {name}"] = seeded(
            lambda seed, extra=extra: trainer(2, 0, epochs, target, seed, extra, setting=SETTING,
                                              data=shifted_mnist))
    notes = (f"Each worker takes {STEPS} steps of {BATCH} rows an epoch; averaging once an epoch lets the workers "
             f"drift for all {STEPS}, `train.sync_every = 50` combines {STEPS // 50} times an epoch, synchronous "
             "SGD sums the gradients at every step. Outer `auto` is Nesterov momentum at two workers "
             "(docs/outer-optimizer.md). MB an epoch are mpi_trainer's own count (rounds.csv). Seeds 0, 1, 2 "
             "(initial weights and shuffle); a cell is the median over seeds.")
    title = (f"Long epochs: a two-hidden-layer perceptron on {ROWS:,} shifted real MNIST digits, Adam 1e-3, batch "
             f"{BATCH} per worker, 2 workers ({STEPS} steps a worker an epoch): time and epochs to {target}")
    return [with_mwms(title, quick, target, variants, notes, lambda seed: mwms(
        epochs, target, seed, optimizer="adam", rate=0.001, batch=BATCH, model="mlp", data=shifted_mnist),
        suite="long_epoch", traffic=True)]
