"""What does a round cost when its bytes cross a real, slow link: two simulated hosts, shaped bandwidth?"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.data import noise
from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import run_job, seeded
from benchmarks.suites.schedules import task, to_target

QUESTION = "Bandwidth: a round between two simulated hosts over a shaped link"
CLUSTER = ROOT / "scripts" / "local_cluster.sh"
PREFIX, SUBNET = "mptbench", "10.88.9.0/24"
RATE_BITS = {"10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}
STATE = Path(os.environ.get("MPT_CLUSTER_ROOT", "/run/mpi_trainer-cluster"))


def unavailable() -> str:
    """Simulated hosts are network namespaces joined by a bridge: root, iproute2 and unshare."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces)"
    missing = [tool for tool in ("ip", "tc", "unshare") if shutil.which(tool) is None]
    if missing:
        return f"simulated hosts need {', '.join(missing)}"
    probe = f"{PREFIX}probe{os.getpid()}"
    if subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode != 0:
        return "this machine does not allow new network namespaces"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def cluster(*args: str) -> None:
    proc = subprocess.run(["bash", str(CLUSTER), *args, "--prefix", PREFIX], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"local_cluster.sh {' '.join(args)} failed:\n{proc.stderr}")


@contextmanager
def prepared() -> Iterator[None]:
    """The two hosts exist for the suite's runs and are removed afterwards, also on failure."""
    try:
        yield
    finally:
        cluster("down")


def shaped(rate: str, slots: str = "1") -> list[str]:
    """Two hosts at ``rate`` each way (re-shapes the hosts already up): the mpirun options that use them."""
    cluster("up", "2", "--bandwidth", rate, "--subnet", SUBNET, "--slots", slots)
    state = next(STATE.glob(f"{PREFIX}.*"))
    return (state / "mpirun_args").read_text().split()


def measure(model: str, shape: tuple[int, ...], rate: str, wire: str, rounds: int, samples: int) -> Figures:
    """One rank a host (the scheduler and one worker), so every byte of a round crosses the link."""
    overrides = [f"data.source={noise(samples, shape)}", f"model.name={model}", f"train.epochs={rounds}",
                 "data.validation_size=0", "checkpoint.every=0", "train.batch_size=32",
                 f"aggregation.wire_dtype={wire}", "log.plots=false", "log.tensorboard=false"]
    _, rows, _ = run_job(2, overrides, mpirun_args=shaped(rate))
    later = rows[1:]  # round 0 traces the graphs

    def median(key: str) -> float:
        return statistics.median(float(row[key]) for row in later)

    sent = int(later[-1]["bytes"])
    return {"bytes": sent, "minimum": sent * 8 / RATE_BITS[rate], "comm": median("comm_seconds"),
            "wall": median("wall_seconds")}


def to_accuracy(quick: bool) -> Comparison:
    """Per-step synchronisation against local epochs and 64-step rounds, with and without the outer optimizer,
    when every round's bytes cross 100 Mbit/s: the scheduler and worker 1 on one host, worker 2 on the other."""
    setup = task(quick)
    runs = {"per-step (`sync_every = 1`), outer `none`": ("1", "none"),
            "1 local epoch, outer `none`": ("epoch", "none"),
            "1 local epoch, outer `nesterov`": ("epoch", "nesterov"),
            "`sync_every = 64`, outer `nesterov`": ("64", "nesterov")}
    return Comparison(
        title=f"Time to {setup['target']} at 100 Mbit/s: {setup['name']}, 2 workers on two simulated hosts, "
              f"{setup['epochs']} local epochs per run, batch {setup['batch']} per worker",
        command=f"python -m benchmarks run bandwidth{' --quick' if quick else ''}",
        variants={name: seeded(lambda seed, sync=sync, spec=spec: to_target(
            setup, sync, spec, seed, mpirun_args=shaped("100mbit", "2,1"))) for name, (sync, spec) in runs.items()},
        columns={"rounds_to": "rounds to target", "mb_to": "MB to it", "seconds_to": "s to it",
                 "final": "final test accuracy"},
        notes="Worker 2's half of every broadcast and reduction crosses the shaped link. Repeat n runs with seed n; "
              "a run that misses the target counts as infinitely long in the median.")


def comparisons(quick: bool) -> list[Comparison]:
    rates = ("1gbit", "100mbit")
    rounds, samples = (3, 200) if quick else (4, 400)
    return [to_accuracy(quick), Comparison(
        title=f"LeNet (1.85 MB) between two simulated hosts, one worker, {rounds} rounds, random 28x28 images",
        command=f"python -m benchmarks run bandwidth{' --quick' if quick else ''}",
        variants={f"{wire}, {rate}": (lambda rate=rate, wire=wire: measure("lenet", (28, 28, 1), rate, wire,
                                                                          rounds, samples))
                  for wire in ("float32", "float16") for rate in rates},
        columns={"bytes": "bytes per round", "minimum": "minimum s (bytes / rate)", "comm": "comm s per round",
                 "wall": "round wall s"},
        notes="Medians of the rounds after round 0. `aggregation.wire_dtype = \"float16\"` halves the bytes; at "
              "1 Gbit/s and above a fixed cost per round (weights in and out of Keras, control messages) remains. "
              "Needs root: the hosts are network namespaces (`scripts/local_cluster.sh`), shaped with tc.")]
