"""Is one worker as fast as plain Keras on the same cores?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import after_first, mean, program, run_job

QUESTION = "Throughput: one worker against plain Keras"


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
