#!/usr/bin/env python3
"""Communication per round against shaped bandwidth, on two simulated hosts (needs root).

Brings up two hosts with ``scripts/local_cluster.sh`` (one rank on each: the scheduler and one
worker, so every byte crosses the shaped link), then for each model and each rate runs a short
job and prints, side by side: bytes per round, the theoretical minimum ``bytes / rate``, the
logged ``comm_seconds`` (median of the rounds after round 0, which traces the graph), its ratio
to the minimum, the round wall time and the worker's training throughput. The data are synthetic
images of the model's input size, used only for traffic and timing. The hosts are removed at
the end, also on failure.

    python scripts/bench_bandwidth.py
    python scripts/bench_bandwidth.py --models lenet --rates 100mbit --rounds 3

At the end it prints the break-even, computed from the measured figures (nothing more is run):
the speed-up of W workers averaging once per epoch over one machine, the slowest link on which
that still pays, and the smallest ``train.sync_every`` (local steps between averagings) that
still beats one machine at the measured rate (see ``break_even`` for the model).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import ROOT, run_job

SCRIPT = ROOT / "scripts" / "local_cluster.sh"
PREFIX, SUBNET = "mptbench", "10.88.9.0/24"
MODELS = {"lenet": (28, 28, 1), "resnet20": (32, 32, 3)}
RATE_BITS = {"10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}


@dataclass
class Measured:
    model: str
    rate: str
    bytes_per_round: int
    comm_seconds: float
    wall_seconds: float
    train_seconds: float
    samples: int

    @property
    def minimum_seconds(self) -> float:
        return self.bytes_per_round * 8 / RATE_BITS[self.rate]


def images(path: Path, shape: tuple[int, int, int], samples: int) -> Path:
    """Random uint8 images and labels: right sizes for traffic and timing, nothing to learn."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(samples, *shape), dtype=np.uint8)
    y = rng.integers(0, 10, size=samples)
    test = max(20, samples // 10)
    np.savez(path, x_train=x[test:], y_train=y[test:], x_test=x[:test], y_test=y[:test])
    return path


def cluster(*args: str) -> str:
    proc = subprocess.run(["bash", str(SCRIPT), *args, "--prefix", PREFIX], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"local_cluster.sh {' '.join(args)} failed:\n{proc.stderr}")
    return proc.stdout


def measure(model: str, rate: str, data: Path, rounds: int, workdir: Path, extra_sets: list[str]) -> Measured:
    cluster("up", "2", "--bandwidth", rate, "--subnet", SUBNET)  # re-shapes the hosts already up
    state = next(Path("/run/mpi_trainer-cluster").glob(f"{PREFIX}.*"))  # the script's fresh state directory
    extra = (state / "mpirun_args").read_text().split()
    overrides = [f"data.source='{data}'", f"model.name={model}", f"train.epochs={rounds}",
                 "data.validation_size=0", "checkpoint.every=0", "train.batch_size=32", *extra_sets]
    _, rows = run_job(2, "configs/quickstart.toml", overrides, workdir / f"{model}-{rate}", extra)
    later = rows[1:]
    median = lambda key: statistics.median(float(r[key]) for r in later)  # noqa: E731
    return Measured(model, rate, int(later[-1]["bytes"]), median("comm_seconds"), median("wall_seconds"),
                    median("train_seconds_max"), int(later[-1]["samples"]))


def table(results: list[Measured]) -> str:
    lines = ["| model | rate | bytes / round | minimum s (bytes / rate) | comm s / round | comm / minimum "
             "| round wall s | worker train s (samples/s) |", "|---|---|---|---|---|---|---|---|"]
    for m in results:
        lines.append(f"| {m.model} | {m.rate} | {m.bytes_per_round:,} | {m.minimum_seconds:.4f} | "
                     f"{m.comm_seconds:.4f} | {m.comm_seconds / m.minimum_seconds:.2f} | {m.wall_seconds:.3f} | "
                     f"{m.train_seconds:.3f} ({m.samples / m.train_seconds:.0f}) |")
    return "\n".join(lines)


def break_even(m: Measured, workers: int, epoch_samples: int, batch: int) -> tuple[float, float, str]:
    """Speed-up of ``workers`` averaging once per epoch, the slowest link where that still pays, and
    the smallest sync_every that still beats one machine at the measured rate.

    Computed, not measured. One machine takes T1 = epoch / (measured samples/s). The measured
    comm seconds split into the wire time (bytes / rate) and a fixed part (setting and reading
    weights, control messages, waits). With W workers rank 0's link carries W times the bytes
    (as with a flat gather), so one averaging costs fixed + W * bytes / rate; W workers take
    T1 / W plus that per averaging, and k averagings per epoch pay while k * cost < T1 (1 - 1/W).
    """
    one_machine = epoch_samples * m.train_seconds / m.samples
    fixed = max(0.0, m.comm_seconds - m.minimum_seconds)
    cost = fixed + workers * m.minimum_seconds
    budget = one_machine * (1 - 1 / workers)  # the time W workers save on computing one epoch
    speedup = one_machine / (one_machine / workers + cost)
    slowest_link = workers * m.bytes_per_round * 8 / (budget - fixed) if budget > fixed else float("inf")
    averagings_that_pay = budget / cost
    if averagings_that_pay < 1:
        return speedup, slowest_link, "never (even once per epoch is slower)"
    steps_per_epoch = epoch_samples / (workers * batch)
    return speedup, slowest_link, f">= {max(1, int(np.ceil(steps_per_epoch / averagings_that_pay)))} steps"


def break_even_table(results: list[Measured], epoch_samples: int, batch: int) -> str:
    lines = [f"Computed for an epoch of {epoch_samples:,} samples, batch {batch}:",
             "| model | rate | workers | speed-up, averaging once per epoch | slowest link where that "
             "still pays | sync_every that still pays |", "|---|---|---|---|---|---|"]
    for m in results:
        for workers in (2, 4, 8):
            speedup, slowest, sync = break_even(m, workers, epoch_samples, batch)
            lines.append(f"| {m.model} | {m.rate} | {workers} | {speedup:.2f} | {slowest / 1e6:.2f} Mbit/s "
                         f"| {sync} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--rates", nargs="+", default=list(RATE_BITS), choices=list(RATE_BITS))
    parser.add_argument("--rounds", type=int, default=4, help="rounds per job; round 0 is not counted")
    parser.add_argument("--samples", type=int, default=400, help="training samples (all on the one worker)")
    parser.add_argument("--epoch-samples", type=int, default=60000,
                        help="epoch size for the break-even (60,000: MNIST; 50,000: CIFAR-10)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every job, e.g. aggregation.wire_dtype=float16")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for model in args.models:
                data = images(Path(tmp) / f"{model}.npz", MODELS[model], args.samples + args.samples // 9)
                for rate in args.rates:
                    results.append(measure(model, rate, data, args.rounds, Path(tmp), args.sets))
                    print(table(results[-1:]).splitlines()[-1], flush=True)
        finally:
            cluster("down")
    print(table(results))
    print(break_even_table(results, args.epoch_samples, 32))


if __name__ == "__main__":
    main()
