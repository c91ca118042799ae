"""Is one worker as fast as plain Keras on the same cores?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import after_first, mean, program, run_job

QUESTION = "Throughput: one worker against plain Keras"
# Finished investigations: each answer is now a default, kept here with the figure that settled it.
SETTLED = [
    "TensorFlow's oneDNN kernels stay on (its default): turning them off halved LeNet's training speed here "
    "(629 against 321 samples/s, alternating processes; commit `3eb03e7`).",
    "Workers feed `fit` their own pipeline rather than Keras' autotuned tf.data: 0 of 40 one-epoch fits returned "
    "late against 5 (worst 1.09 s) on Keras' arrays (commit `e64fbd6`).",
    "`evaluation.where = \"workers\"` shortened a LeNet round to 0.955x the scheduler's on one 2-core node; "
    "`\"scheduler\"` stays the default because SSP, `train.overlap_eval` and L-BFGS need it (commit `18d1285`).",
]


def plain(epochs: int, model: str) -> Figures:
    result = program("plain_keras", ["--epochs", str(epochs), "--set", f"model.name={model}"])
    return {key: result[key] for key in ("samples_per_second", "seconds_per_epoch", "final_test_accuracy")}


def one_worker(epochs: int, model: str) -> Figures:
    summary, rounds, _ = run_job(2, [f"train.epochs={epochs}", f"model.name={model}"])
    samples, seconds = after_first(rounds, "samples"), after_first(rounds, "train_seconds_max")
    return {"samples_per_second": sum(samples) / sum(seconds), "seconds_per_epoch": mean(after_first(rounds,
            "wall_seconds")), "final_test_accuracy": summary["final_test_accuracy"]}


def quick_start() -> Figures:
    """``configs/quickstart.toml`` as shipped (what ``scripts/quickstart.sh`` runs): 2 workers, 20 rounds."""
    summary, _, seconds = run_job(3, [])
    return {"final_test_accuracy": summary["final_test_accuracy"], "training_seconds": summary["wall_seconds"],
            "command_seconds": seconds}


def comparisons(quick: bool) -> list[Comparison]:
    epochs, model = (4, "mlp") if quick else (8, "lenet")
    flag = " --quick" if quick else ""
    return [
        Comparison(
            title="The quick start: `mpirun -n 3 ... train configs/quickstart.toml`, MLP on digits, 2 workers, "
                  "20 rounds",
            command=f"python -m benchmarks run throughput{flag}",
            variants={"mpi_trainer, 2 workers, `average`": quick_start},
            columns={"final_test_accuracy": "final test accuracy", "training_seconds": "training s (summary.json)",
                     "command_seconds": "whole command s"},
            notes="The whole command includes the start-up of three TensorFlow processes and the end-of-run plots."),
        Comparison(
            title=f"{model} on digits, {epochs} epochs = rounds, batch 32, scored every epoch",
            command=f"python -m benchmarks run throughput{flag}",
            variants={"plain Keras `fit` (one process)": lambda: plain(epochs, model),
                      "mpi_trainer, 1 worker (`mpirun -n 2`)": lambda: one_worker(epochs, model)},
            columns={"samples_per_second": "train samples/s", "seconds_per_epoch": "s per epoch + scoring",
                     "final_test_accuracy": "final test accuracy"},
            notes="Samples/s and seconds leave out the first epoch (graph tracing)."),
    ]
