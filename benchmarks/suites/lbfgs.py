"""Does full-batch L-BFGS over workers cost what the same objective costs in one process?"""

from __future__ import annotations

import statistics

from benchmarks.data import prototypes
from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import program, run_job

QUESTION = "Full-batch L-BFGS: workers against one process"
BATCH = 6000


def one_process(samples: int, iterations: int, last: dict[str, float]) -> Figures:
    result = program("lbfgs_one_process", [str(prototypes(samples, (28, 28))), "--iterations", str(iterations),
                                           "--batch", str(BATCH)])
    last["loss"] = result["loss"]  # what the distributed runs of this repeat are compared with
    return {"ms": 1e3 * result["per_evaluation"], "evaluations": result["evaluations"], "loss": result["loss"]}


def workers(count: int, samples: int, iterations: int, last: dict[str, float]) -> Figures:
    """Per evaluation: the scheduler's wall time of an iteration without its test scoring, over the
    iteration's evaluations (the median: a descheduled process would skew a mean)."""
    _, rounds, _ = run_job(count + 1, [f"data.source={prototypes(samples, (28, 28))}", f"train.epochs={iterations}",
                                       f"lbfgs.batch_size={BATCH}", "log.plots=false", "log.tensorboard=false"],
                           config="configs/mnist_softmax_lbfgs.toml")
    counts = [0] + [int(row["function_evaluations"]) for row in rounds]
    per_iteration = [(float(row["wall_seconds"]) - float(row["eval_seconds"])) / (after - before)
                     for row, before, after in zip(rounds, counts, counts[1:]) if after > before]
    loss = float(rounds[-1]["train_loss"])
    parameters = 7850  # softmax regression, 784 -> 10
    return {"ms": 1e3 * statistics.median(per_iteration), "evaluations": counts[-1], "loss": loss,
            "relative": abs(loss / last["loss"] - 1) if "loss" in last else float("nan"),
            "bytes": sum(int(row["bytes"]) for row in rounds) / counts[-1],
            "formula": 8 * count * (2 * parameters + count + 3)}


def comparisons(quick: bool) -> list[Comparison]:
    samples, iterations = (12000, 5) if quick else (72000, 10)
    last: dict[str, float] = {}
    train = samples - samples // 6
    return [Comparison(
        title=f"Softmax regression (7,850 parameters) on {train:,} synthetic MNIST-shaped images, "
              f"{iterations} iterations",
        command=f"python -m benchmarks run lbfgs{' --quick' if quick else ''}",
        variants={"one process, every core": lambda: one_process(samples, iterations, last),
                  "mpi_trainer, 1 worker": lambda: workers(1, samples, iterations, last),
                  "mpi_trainer, 2 workers": lambda: workers(2, samples, iterations, last)},
        columns={"ms": "ms per evaluation (median)", "evaluations": "evaluations", "loss": "final loss",
                 "relative": "final loss vs one process (relative)", "bytes": "bytes per evaluation",
                 "formula": "8W(2P + W + 3)"},
        notes="Each repeat runs the one process first; the workers' final loss is compared with that repeat's.")]
