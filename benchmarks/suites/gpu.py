"""Do workers that share a node's GPUs train as fast as plain Keras on them?"""

from __future__ import annotations

import subprocess
import threading

from benchmarks.data import prototypes
from benchmarks.harness import Comparison, Figures, gpu_names
from benchmarks.jobs import after_first, program, run_job

QUESTION = "GPU workers: mpi_trainer's workers against plain Keras on the same GPUs"
SHAPE = (32, 32, 3)
RESNET = ["data.validation_size=0.0", "model.name=resnet20"]


def unavailable() -> str:
    return "" if gpu_names() else "no GPU on this machine (nvidia-smi lists none)"


def gpu_mib() -> int:
    """GPU memory held by all processes now, MiB."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(int(line) for line in out.split() if line.strip().isdigit())


def plain(samples: int, epochs: int, batch: int) -> Figures:
    sets = [x for item in [f"data.source={prototypes(samples, SHAPE)}", *RESNET, f"train.batch_size={batch}"]
            for x in ("--set", item)]
    result = program("plain_keras", [*sets, "--epochs", str(epochs)])
    return {"samples_per_second": result["samples_per_second"]}


def workers(count: int, samples: int, epochs: int, batch: int) -> Figures:
    """``train.device = auto``: worker i takes GPU i mod gpus; the scheduler none. GPU memory is
    sampled every second while the job runs."""
    overrides = [f"data.source={prototypes(samples, SHAPE)}", *RESNET, "train.device=auto",
                 f"train.epochs={epochs}", f"train.batch_size={batch}", "checkpoint.every=0", "log.plots=false"]
    done, peak = threading.Event(), [0]

    def watch() -> None:
        while not done.wait(1.0):
            peak[0] = max(peak[0], gpu_mib())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        summary, rounds, _ = run_job(count + 1, overrides)
    finally:
        done.set()
        watcher.join()
    gpu_ranks = sum(1 for place in summary.get("placement", []) if "gpu" in str(place.get("device", "")).lower())
    return {"samples_per_second": sum(after_first(rounds, "samples")) / sum(after_first(rounds, "wall_seconds")),
            "gpu_ranks": gpu_ranks, "peak_mib": peak[0]}


def comparisons(quick: bool) -> list[Comparison]:
    samples, epochs, batch = (6000, 3, 128) if quick else (12000, 4, 128)
    counts = (1, 2) if quick else (1, 2, 4)
    variants = {"plain Keras `fit`": lambda: plain(samples, epochs, batch)}
    variants |= {f"mpi_trainer, {n} worker{'s' if n > 1 else ''}": (lambda n=n: workers(n, samples, epochs, batch))
                 for n in counts}
    return [Comparison(
        title=f"ResNet-20 on {samples * 5 // 6:,} synthetic CIFAR-sized images, batch {batch}, "
              f"{epochs} epochs = rounds",
        command=f"python -m benchmarks run gpu{' --quick' if quick else ''}",
        variants=variants,
        columns={"samples_per_second": "train samples/s", "gpu_ranks": "ranks on a GPU",
                 "peak_mib": "peak GPU MiB, all ranks"},
        notes="Samples/s leave out the first epoch or round (compilation); mpi_trainer's rounds include the "
              "scheduler's test scoring, plain `fit` scores nothing.")]
