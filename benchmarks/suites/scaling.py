"""How does throughput grow with the number of CPU workers on one node?"""

from __future__ import annotations

import os

from benchmarks.data import mnist5k
from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import MNIST_LENET, QUICKSTART, after_first, curve, program, run_job, time_to

QUESTION = "Scaling: CPU workers on one node"


def setup(quick: bool) -> dict:
    """quick: the MLP on digits; else LeNet on real MNIST with Adadelta, batch 64 (as bench accuracy)."""
    if quick:
        return {"name": "MLP on digits", "config": QUICKSTART, "epochs": 4, "target": 0.95, "set": []}
    return {"name": "LeNet on 5,000 real MNIST digits", "config": MNIST_LENET, "epochs": 6, "target": 0.95,
            "set": [f"data.source={mnist5k()}", "data.validation_size=0.0", "model.name=lenet",
                    "model.optimizer=adadelta", "model.learning_rate=1.0", "train.batch_size=64"]}


def plain(task: dict, threads: int) -> Figures:
    sets = [x for item in task["set"] for x in ("--set", item)]
    result = program("plain_keras", ["--config", task["config"], *sets, "--epochs", str(task["epochs"]),
                                     "--threads", str(threads)])
    return {"samples_per_second": result["samples_per_second"], "seconds_per_epoch": result["seconds_per_epoch"],
            "seconds_to_target": time_to([tuple(p) for p in result["curve"]], task["target"])}


def workers(task: dict, count: int, threads: int, one: dict[str, float]) -> Figures:
    """``one`` holds this repeat's 1-worker samples/s, what the speed-up and efficiency divide by."""
    overrides = [*task["set"], f"train.epochs={task['epochs']}", f"train.threads={threads}", "train.device=cpu",
                 "checkpoint.every=0", "log.plots=false", "log.tensorboard=false"]
    _, rounds, _ = run_job(count + 1, overrides, config=task["config"])
    rate = sum(after_first(rounds, "samples")) / sum(after_first(rounds, "train_seconds_max"))
    if count == 1:
        one["rate"] = rate
    speedup = rate / one["rate"] if "rate" in one else float("nan")
    elapsed = [float(row["elapsed_seconds"]) for row in rounds]
    return {"samples_per_second": rate, "seconds_per_epoch": (elapsed[-1] - elapsed[0]) / max(1, len(elapsed) - 1),
            "speedup": speedup, "efficiency": speedup / count,
            "seconds_to_target": time_to(curve(rounds), task["target"])}


def comparisons(quick: bool) -> list[Comparison]:
    task, cores = setup(quick), os.cpu_count() or 1
    counts = sorted({1, 2, *(n for n in (4, 8) if n <= cores)})
    threads = max(1, cores // max(counts))  # the scheduler mostly waits
    one: dict[str, float] = {}
    variants = {f"plain Keras `fit`, {threads} thread{'s' if threads > 1 else ''}": lambda: plain(task, threads)}
    if threads != cores:
        variants[f"plain Keras `fit`, all {cores} cores"] = lambda: plain(task, cores)
    variants |= {f"mpi_trainer, {n} worker{'s' if n > 1 else ''}": (lambda n=n: workers(task, n, threads, one))
                 for n in counts}
    return [Comparison(
        title=f"{task['name']}, {task['epochs']} epochs = rounds, every process at {threads} thread(s) "
              f"(`train.threads`), `train.device = cpu`",
        command=f"python -m benchmarks run scaling{' --quick' if quick else ''}",
        variants=variants,
        columns={"samples_per_second": "train samples/s", "seconds_per_epoch": "s per epoch + scoring",
                 "speedup": "speed-up", "efficiency": "efficiency", "seconds_to_target": f"s to {task['target']}"},
        notes="Samples/s of a round are its samples over its slowest worker's training time, leaving out round 0 "
              "(graph tracing); efficiency is the speed-up over the worker count (weak scaling, the same threads "
              "per worker). With `KERAS_BACKEND=jax` it measures the JAX backend.")]
