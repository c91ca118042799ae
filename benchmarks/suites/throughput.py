"""Is one worker as fast as plain Keras on the same cores?"""

from __future__ import annotations

import json
import subprocess

from benchmarks.harness import ROOT, Comparison, Figures, python
from benchmarks.jobs import after_first, mean, run_job

QUESTION = "Throughput: one worker against plain Keras"


def plain(epochs: int, model: str) -> Figures:
    out = subprocess.run([python(), "-m", "benchmarks.plain_keras", "--epochs", str(epochs), "--model", model],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def one_worker(epochs: int, model: str) -> Figures:
    summary, rounds, _ = run_job(2, [f"train.epochs={epochs}", f"model.name={model}"])
    samples, seconds = after_first(rounds, "samples"), after_first(rounds, "train_seconds_max")
    return {"samples_per_second": sum(samples) / sum(seconds), "seconds_per_epoch": mean(after_first(rounds,
            "wall_seconds")), "final_test_accuracy": summary["final_test_accuracy"]}


def comparisons(quick: bool) -> list[Comparison]:
    epochs, model = (4, "mlp") if quick else (8, "lenet")
    return [Comparison(
        title=f"{model} on digits, {epochs} epochs = rounds, batch 32, scored every epoch",
        command=f"python -m benchmarks run throughput{' --quick' if quick else ''}",
        variants={"plain Keras `fit` (one process)": lambda: plain(epochs, model),
                  "mpi_trainer, 1 worker (`mpirun -n 2`)": lambda: one_worker(epochs, model)},
        columns={"samples_per_second": "train samples/s", "seconds_per_epoch": "s per epoch + scoring",
                 "final_test_accuracy": "final test accuracy"},
        notes="Samples/s and seconds leave out the first epoch (graph tracing).")]
