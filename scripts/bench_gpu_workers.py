"""Workers sharing one GPU vs plain Keras ``fit`` on the same GPU and backend, side by side.

ResNet-20 on a synthetic CIFAR-sized set (32x32x3, 10 classes). Plain Keras: one process,
``model.fit`` for E epochs. mpi_trainer: ``mpirun -n W+1`` for E rounds with ``train.device=auto``
(each worker takes a GPU of the node, i mod gpus; the scheduler sees none). Samples/s leave out
the first epoch / round (compilation). While each job runs, ``nvidia-smi --query-compute-apps``
is sampled to show which rank held GPU memory. mpi_trainer's rounds include the scheduler's test
evaluation, plain `fit` evaluates nothing. Runs on CPU as well (then no GPU processes).

    KERAS_BACKEND=jax python scripts/bench_gpu_workers.py [--workers 1 2 4] [--epochs 4] [--samples 12000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchlib import ROOT, mpirun_command, read_rounds

PLAIN = r"""
import json, sys, time
import keras
from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
epochs, batch = int(sys.argv[2]), int(sys.argv[3])
data = load_dataset(DataConfig(source=sys.argv[1], validation_size=0.0), seed=0)
keras.utils.set_random_seed(0)
model, _ = build_model(ModelConfig(name="resnet20"), data.input_shape, data.num_outputs)
ends = []
timer = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()))
model.fit(data.x_train, data.y_train, batch_size=batch, epochs=epochs, verbose=0, callbacks=[timer])
seconds = ends[-1] - ends[0]
print(json.dumps({"samples_per_second": len(data.x_train) * (epochs - 1) / seconds,
                  "backend": keras.backend.backend()}))
"""


def cifar_sized(path: Path, samples: int, seed: int = 0) -> Path:
    """Noisy class prototypes, uint8 32x32x3, in Keras' layout (5/6 train)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(0, 256, size=(10, 32, 32, 3))
    labels = rng.integers(0, 10, size=samples)
    images = np.clip(prototypes[labels] + rng.normal(0, 60, size=(samples, 32, 32, 3)), 0, 255).astype(np.uint8)
    split = samples * 5 // 6
    np.savez(path, x_train=images[:split], y_train=labels[:split], x_test=images[split:], y_test=labels[split:])
    return path


def gpu_processes() -> dict[int, int]:
    """pid -> MiB of every process holding GPU memory now (empty without nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    rows = [line.split(",") for line in out.splitlines() if line.strip()]
    return {int(pid): int(mib) for pid, mib in rows}


def mpi_rank(pid: int) -> str:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "?"
    found = [item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"OMPI_COMM_WORLD_RANK=")]
    return found[0] if found else "?"


def run_watched(workers: int, data: Path, epochs: int, batch: int, run_dir: Path) -> tuple[dict, dict[str, int]]:
    """One mpi_trainer job; its summary and the most GPU memory each rank held while it ran."""
    overrides = [f"data.source='{data}'", "data.validation_size=0.0", "model.name=resnet20", "train.device=auto",
                 f"train.epochs={epochs}", f"train.batch_size={batch}", "checkpoint.every=0"]
    args = ["train", "configs/quickstart.toml", "--run-dir", str(run_dir)]
    args += [word for item in overrides for word in ("--set", item)]
    console = run_dir.with_suffix(".out")
    with console.open("w") as out:  # a file, not a pipe: a full pipe would stall the job
        proc = subprocess.Popen(mpirun_command(workers + 1, args), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        held: dict[str, int] = {}
        while proc.poll() is None:
            for pid, mib in gpu_processes().items():
                rank = mpi_rank(pid)
                held[rank] = max(held.get(rank, 0), mib)
            time.sleep(1.0)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}):\n{console.read_text()}")
    return json.loads((run_dir / "summary.json").read_text()), held


def job_rate(run_dir: Path) -> float:
    rounds = read_rounds(run_dir / "rounds.csv")[1:]  # round 0 compiles
    return sum(int(r["samples"]) for r in rounds) / sum(float(r["wall_seconds"]) for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=12000)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = cifar_sized(Path(tmp) / "cifar_sized.npz", args.samples)
        plain = json.loads(subprocess.run([sys.executable, "-c", PLAIN, str(data), str(args.epochs),
                                           str(args.batch_size)], cwd=ROOT, capture_output=True, text=True,
                                          check=True).stdout.strip().splitlines()[-1])
        print(f"backend {plain['backend']}, ResNet-20, {args.samples * 5 // 6} training samples, "
              f"batch {args.batch_size}, {args.epochs} epochs/rounds (first left out)")
        print(f"{'':<26} {'samples/s':>10} {'vs plain':>9}  devices (log)  GPU MiB per rank (nvidia-smi)")
        print(f"{'plain Keras fit':<26} {plain['samples_per_second']:>10.0f} {1.0:>9.3f}")
        for workers in args.workers:
            run_dir = Path(tmp) / f"run{workers}"
            summary, held = run_watched(workers, data, args.epochs, args.batch_size, run_dir)
            rate = job_rate(run_dir)
            devices = ", ".join(f"{p['rank']}:{p['device']}" for p in summary["placement"])
            memory = ", ".join(f"rank {rank}: {mib}" for rank, mib in sorted(held.items())) or "none"
            print(f"{f'mpi_trainer, {workers} worker(s)':<26} {rate:>10.0f} {rate / plain['samples_per_second']:>9.3f}"
                  f"  {devices}  {memory}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
