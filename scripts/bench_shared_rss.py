"""Peak resident memory of a worker under ``data.placement = shared`` with 1 and 3 workers.

Writes an HDF5 file of about ``--megabytes`` MB (float32 32x32x3 images, x/y layout),
trains one round with 1 worker (mpirun -n 2) and with 3 workers (mpirun -n 4), and
reads each worker's peak RSS from its own log line ("stop received; peak RSS ..."). For
reference it also measures one process that imports the same stack and reads the whole
training split, which is what every worker would hold if it loaded the dataset.
The file is deleted at the end.

Usage: python scripts/bench_shared_rss.py [--megabytes 300] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpi_trainer.launch.mpirun import mpirun_command  # noqa: E402

SAMPLE_SHAPE = (32, 32, 3)
RSS_LINE = re.compile(r"\[rank (\d+)/\d+ [^\]]*\] DEBUG stop received; peak RSS ([\d.]+) MiB")
LOADED_LINE = re.compile(r"DEBUG worker rank (\d+): block of \d+ rows in memory \([\d.]+ MiB\), "
                         r"peak RSS ([\d.]+) MiB")


def write_h5(path: Path, megabytes: int) -> int:
    import h5py

    per_sample = int(np.prod(SAMPLE_SHAPE)) * 4
    samples = megabytes * 10**6 // per_sample
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as handle:
        x = handle.create_dataset("x", shape=(samples, *SAMPLE_SHAPE), dtype="float32")
        for start in range(0, samples, 2000):
            end = min(samples, start + 2000)
            x[start:end] = rng.random((end - start, *SAMPLE_SHAPE), dtype=np.float32)
        handle.create_dataset("y", data=rng.integers(0, 10, samples))
    return samples


def overrides(source: Path) -> list[str]:
    sets = [f"data.source={source}", "data.placement=shared", "model.name=softmax_regression",
            "train.epochs=1", "train.batch_size=512", "log.verbosity=2", "checkpoint.every=0"]
    return [arg for item in sets for arg in ("--set", item)]


def worker_peaks(workers: int, source: Path, run_dir: Path) -> tuple[dict[int, float], dict[int, float]]:
    """Per worker rank: peak RSS once its block is loaded, and at the end of the run."""
    args = ["train", "configs/quickstart.toml", *overrides(source), "--run-dir", str(run_dir)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run(mpirun_command(workers + 1, args), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"run with {workers} workers failed:\n{proc.stdout}\n{proc.stderr}")
    loaded = {int(rank): float(mib) for rank, mib in LOADED_LINE.findall(proc.stdout)}
    return loaded, {int(rank): float(mib) for rank, mib in RSS_LINE.findall(proc.stdout)}


def whole_split_peak(source: Path) -> float:
    """One process with the same imports that reads the whole training split."""
    code = (
        "import keras, resource\n"
        "from mpi_trainer.config import load_config\n"
        "from mpi_trainer.data.sources import load_dataset\n"
        f"cfg = load_config(None, ['data.source={source}'])\n"
        "d = load_dataset(cfg.data, 0, read_val=False, read_test=False)\n"
        "x = d.x_train\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return float(out.stdout.strip().splitlines()[-1])


def by_rank(values: dict[int, float]) -> str:
    return ", ".join(f"rank {rank} {mib:.0f} MiB" for rank, mib in sorted(values.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description="worker peak RSS, shared placement, 1 vs 3 workers")
    parser.add_argument("--megabytes", type=int, default=300)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        source = Path(tmp) / "bench.h5"
        samples = write_h5(source, args.megabytes)
        size_mb = source.stat().st_size / 1e6
        train = samples - round(samples * 0.2)
        train -= round(train * 0.1)
        print(f"HDF5 file: {size_mb:.0f} MB, {samples} samples of {SAMPLE_SHAPE} float32, "
              f"{train} in the training split ({train * np.prod(SAMPLE_SHAPE) * 4 / 2**20:.0f} MiB)")
        whole = whole_split_peak(source)
        print(f"reference: one process reading the whole training split: peak RSS {whole:.0f} MiB")
        results = {}
        for workers in (1, 3):
            loaded, peaks = worker_peaks(workers, source, Path(tmp) / f"run{workers}")
            block_mib = train / workers * np.prod(SAMPLE_SHAPE) * 4 / 2**20
            results[workers] = peaks
            print(f"{workers} worker(s): block {train // workers} samples ({block_mib:.0f} MiB); worker peak "
                  f"RSS after loading its block: {by_rank(loaded)}; at the end: {by_rank(peaks)}")
        ratio = max(results[3].values()) / max(results[1].values())
        print(f"ratio of worker peak RSS at the end, 3 workers / 1 worker: {ratio:.2f}")
    print("benchmark file deleted")


if __name__ == "__main__":
    main()
