"""Do big models' rounds run at memory speed: a round's communication and combining against what this machine's
memory allows and against the MPI floor, through shared memory and through MPI's collectives, per wire; and
each rank's memory?"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache, partial
from pathlib import Path

from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import ENV, JobFailed, after_first, mean, program, train_command
from benchmarks.memory_speed import bandwidths, memory_bound
from benchmarks.suites import bandwidth
from mpi_trainer.persistence.run_files import read_rounds

QUESTION = ("Big models: a round's communication and combining against the memory bound and the MPI floor, "
            "through shared memory and MPI, per wire dtype and outer optimizer, and peak RSS")
SIZES = {"25m": 99.0, "100m": 402.0}  # the MLP's float32 megabytes (benchmarks.big_mlp)
STATE_COPIES = 3  # the state a round moves: the weights and Adam's two moments (configs/quickstart.toml's optimizer)
WORKERS = 2
WIRES, OUTERS = ("float32", "float16"), ("none", "nesterov")
ROUNDS, STEPS = 3, 4  # epochs of rounds of a few local steps: the round's other phases are what is measured
NO_SHARED_MEMORY = ["-x", "MPI_TRAINER_SHARED_MEMORY=0"]  # the job's collectives through MPI (comm.shared_memory)
# Budgets above the baseline, in copies of the state a round moves. Rank 0: its model's variables and the spare
# buffer each keeps for the next write (trainer.state.HandedBuffers), the round's buffer and the round's start,
# and the outer optimizer's state with its copy saved before each step (up to 2x the trainable third): 6 states.
# A worker: plain Keras training the model, plus the round's buffer and its variables' spare buffers: 2 states.
SCHEDULER_STATES, WORKER_STATES = 6, 2
HOST_RATES = ("1gbit", "100mbit")  # links between two simulated hosts (root only: network namespaces)


@cache
def floor_seconds(megabytes: float) -> float:
    """Blocking MPI Reduce + Bcast of ``megabytes`` at 3 ranks (median of 3), in seconds."""
    result = program("transport_job", ["--payload-mb", str(megabytes), "--reps", "3"], ranks=3)
    return float(result["Reduce"] + result["Bcast"]) / 1000


def state_megabytes(size: str) -> float:
    return SIZES[size] * STATE_COPIES


@cache
def memory_seconds(size: str) -> float:
    """The memory bound of a round of the model's state: one in-place add and one copy per worker, one thread."""
    return memory_bound(int(state_megabytes(size) * 1e6 / 4), WORKERS, 3)


@cache
def combine_seconds(size: str) -> float:
    """Rank 0's combine of the model's whole state on its own, one thread (:mod:`benchmarks.combine_speed`): the
    arithmetic a round adds besides moving its bytes."""
    return float(program("combine_speed", ["--size", size])["seconds"])


@cache
def machine_bandwidths() -> tuple[float, float]:
    """This machine's copy and add rates (GB/s, one thread) over 100M float32 values."""
    return bandwidths(100_000_000, 3)


def overrides(size: str, wire: str, outer: str, model: str | None = None) -> list[str]:
    return [f"model.name={model or f'benchmarks.big_mlp:mlp_{size}'}", f"train.epochs={ROUNDS}",
            "train.batch_size=128", f"train.sync_every={STEPS}", "evaluation.every=1", "checkpoint.every=0",
            "log.plots=false", f"aggregation.wire_dtype={wire}", f"aggregation.outer_optimizer={outer}"]


def peak_rss_command(command: list[str], folder: Path) -> list[str]:
    """``... python -m MODULE ARGS`` as ``... python -m benchmarks.peak_rss FOLDER MODULE ARGS``."""
    at = command.index("-m")
    return [*command[:at], "-m", "benchmarks.peak_rss", str(folder), *command[at + 1:]]


def peaks_of(command: list[str], folder: Path) -> dict[int, float]:
    """Run ``command`` (under :mod:`benchmarks.peak_rss`); every rank's peak RSS in GB."""
    proc = subprocess.run(peak_rss_command(command, folder), cwd=ROOT, env=ENV, capture_output=True, text=True)
    if proc.returncode != 0:
        raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return {int(p["rank"]): p["peak_rss_gb"] for p in (json.loads(f.read_text()) for f in folder.glob("*.json"))}


@cache
def backend_baseline() -> tuple[float, float]:
    """Peak RSS of rank 0 and of a worker in the same job with the quick start's small MLP: the backend's cost."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        command = train_command(3, "configs/quickstart.toml", overrides("25m", "float32", "nesterov", "mlp"),
                                Path(tmp) / "run")
        peaks = peaks_of(command, Path(tmp) / "rss")
    return peaks[0], max(v for k, v in peaks.items() if k)


@cache
def plain_keras_peak(size: str) -> float:
    """Peak RSS of one process training the model with plain Keras ``fit`` (one epoch, the same batch)."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        command = [sys.executable, "-m", "benchmarks.plain_keras", "--epochs", "1",
                   "--set", f"model.name=benchmarks.big_mlp:mlp_{size}", "--set", "train.batch_size=128"]
        return peaks_of(command, Path(tmp) / "rss")[0]


def job(size: str, wire: str, outer: str, shared: bool = True) -> Figures:
    """One 3-rank job: each phase of a round (rounds.csv's epochs after the first, divided by their rounds),
    bytes, and every rank's peak RSS against its budget. ``shared``: collectives through the node's shared
    memory (the default on one node), else through MPI's."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        command = train_command(3, "configs/quickstart.toml", overrides(size, wire, outer), run_dir,
                                mpirun_args=None if shared else NO_SHARED_MEMORY)
        peaks = peaks_of(command, Path(tmp) / "rss")
        rounds = read_rounds(run_dir / "rounds.csv")
    floor, memory, state_gb = floor_seconds(state_megabytes(size)), memory_seconds(size), state_megabytes(size) / 1000
    per_round = [math.ceil(steps / WORKERS / STEPS) for steps in after_first(rounds, "steps")]  # rounds an epoch

    def round_mean(column: str) -> float:
        return mean([value / count for value, count in zip(after_first(rounds, column), per_round)])

    train, aggregate, evaluate = (round_mean(column) for column in
                                  ("train_seconds_max", "aggregate_seconds", "eval_seconds"))
    overhead = round_mean("wall_seconds") - train - evaluate  # communication and combining
    copy_rate, add_rate = machine_bandwidths()
    return {"memory": memory, "floor": floor, "train": train, "comm": overhead - aggregate, "aggregate": aggregate,
            "overhead": overhead, "to_memory": overhead / memory, "to_floor": overhead / floor,
            "combine_alone": combine_seconds(size), "eval": evaluate,
            "bytes": round_mean("bytes") / 1e6, "copy_gbs": copy_rate, "add_gbs": add_rate,
            "rss0": peaks.get(0, float("nan")), "budget0": backend_baseline()[0] + SCHEDULER_STATES * state_gb,
            "rss_workers": max((v for k, v in peaks.items() if k), default=float("nan")),
            "budget_workers": plain_keras_peak(size) + WORKER_STATES * state_gb}


def across_hosts(rate: str, wire: str) -> Figures:
    """25M parameters, the scheduler on one simulated host and its one worker on the other, so that every
    byte of a round crosses the shaped link: each round's communication and wall time, and ``auto``'s pick."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir = Path(tmp) / "run"
        command = train_command(2, "configs/quickstart.toml", overrides("25m", wire, "nesterov"), run_dir,
                                mpirun_args=bandwidth.shaped(rate))
        proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        rounds = read_rounds(run_dir / "rounds.csv")
        # the choice is logged before the run directory's log opens: on the console
        picked = re.search(r"wire_dtype = auto: (\w+)", proc.stdout + proc.stderr)
    sent = mean(after_first(rounds, "bytes"))
    # each way carries half a round's bytes (the state up in the sum, back down with it or in the next order)
    return {"bytes": sent / 1e6, "minimum": sent / 2 * 8 / bandwidth.RATE_BITS[rate],
            "comm": mean(after_first(rounds, "comm_seconds")), "wall": mean(after_first(rounds, "wall_seconds")),
            "float16": float((picked.group(1) if picked else wire) == "float16")}


@contextmanager
def prepared() -> Iterator[None]:
    """The simulated hosts, where this machine allows them, are removed after the suite, also on failure."""
    if bandwidth.unavailable():
        yield
        return
    with bandwidth.prepared():
        yield


def variants(sizes: list[str]) -> dict[str, Callable[[], Figures]]:
    """Every size with float32 and float16 wires under none and nesterov, the wire ``auto`` picks, and the
    float32 wire under nesterov through MPI's collectives."""
    named: dict[str, Callable[[], Figures]] = {}
    for size in sizes:
        for wire in (*WIRES, "auto"):
            for outer in OUTERS if wire != "auto" else ("nesterov",):
                named[f"{size.upper()} parameters, {wire} wire, outer {outer}"] = partial(job, size, wire, outer)
        named[f"{size.upper()} parameters, float32 wire, outer nesterov, through MPI"] = partial(
            job, size, "float32", "nesterov", False)
    return named


def hosts_comparison(quick: bool) -> Comparison:
    flag = " --quick" if quick else ""
    return Comparison(
        title="25M parameters between two simulated hosts: seconds per round (mean of rounds 1-2) per wire",
        command=f"python -m benchmarks run big_models{flag} --repeats 1",
        variants={f"{wire} wire, {rate}": partial(across_hosts, rate, wire)
                  for rate in HOST_RATES for wire in (*WIRES, "auto")},
        columns={"bytes": "MB per round", "minimum": "minimum s (half the bytes each way / rate)",
                 "comm": "communication s",
                 "wall": "round wall s", "float16": "float16 on the wire (1 = yes)"},
        notes="The scheduler on one host and one worker on the other (`scripts/local_cluster.sh`, network "
              "namespaces shaped with tc), so the broadcast and the reduction both cross the link; outer "
              "Nesterov, the settings of the table above otherwise. `auto` times each link and a float16 cast "
              "before set-up; the last column says what it picked. Needs root.")


def comparisons(quick: bool) -> list[Comparison]:
    sizes = ["25m"] if quick else list(SIZES)
    flag = " --quick" if quick else ""
    hosts = [] if bandwidth.unavailable() else [hosts_comparison(quick)]
    return [Comparison(
        title="Seconds per round (mean of epochs 1-2) on 3 ranks against the memory bound and the MPI floor; "
              "peak RSS of each rank",
        command=f"python -m benchmarks run big_models{flag} --repeats 1",
        variants=variants(sizes),
        columns={"memory": "memory bound s", "floor": "MPI floor s (Reduce + Bcast)", "train": "training s",
                 "comm": "communication s", "aggregate": "combining s", "overhead": "communication + combining s",
                 "to_memory": "overhead / memory bound", "to_floor": "overhead / MPI floor",
                 "combine_alone": "rank 0's combine alone s (one thread)",
                 "eval": "evaluation s", "bytes": "MB per round", "copy_gbs": "copy GB/s", "add_gbs": "add GB/s",
                 "rss0": "rank 0 peak GB", "budget0": "rank 0 budget GB", "rss_workers": "worker peak GB",
                 "budget_workers": "worker budget GB"},
        notes=f"MLPs of 3 hidden layers on digits (`benchmarks.big_mlp`) with Adam, so a round moves the weights "
              f"and both moments ({STATE_COPIES}x the model's float32 bytes), {WORKERS} workers, {ROUNDS} epochs "
              f"of rounds of {STEPS} local steps (`train.sync_every={STEPS}`: 2 rounds an epoch), so that what a "
              "round does besides training shows; evaluation every epoch; no checkpoint but the final one. "
              "Per round: an epoch's figures divided by its rounds. Training is the slowest worker's time in "
              "`fit`; evaluation rank 0's scoring; communication + combining is the rest of the round's wall "
              "time (the overhead): the workers' reading and writing of their state, the transfers, rank 0's "
              "combine, finiteness check and outer step (combining: the seconds rank 0 spent in them, much of "
              "it while the next part of the sum travels), and the hand-out. The memory bound is what the "
              "round's bytes need at least on this machine, measured in the same run: one in-place add and one "
              "copy of the state per worker, on one thread (`benchmarks.memory_speed`; the copy and add rates "
              "are shown). Rank 0's combine alone is the arithmetic the round adds to that: the state combined by "
              "meaning, checked finite and stepped by outer Nesterov on one thread, outside the job "
              "(`python -m benchmarks.combine_speed --size 25m`). The MPI floor is blocking MPI `Reduce` + "
              "`Bcast` of the state's bytes at 3 ranks in "
              "the same run. `through MPI`: the same job with `MPI_TRAINER_SHARED_MEMORY=0`, MPI's collectives "
              "instead of the node's shared memory. `auto`: the wire `aggregation.wire_dtype = \"auto\"` "
              "picks: float32 on one node, else after timing each link and a float16 cast. "
              "Peak RSS is `getrusage`'s, over the whole job, the final checkpoint included. Rank 0's budget: "
              f"its peak in the same job with the quick start's small MLP (the backend's baseline) + "
              f"{SCHEDULER_STATES}x the state (its model's variables and a spare buffer for each, the round's "
              "buffer and its start, the outer optimizer's state and the copy saved before each step); a "
              "worker's: plain Keras `fit` of the model in one process (`benchmarks.plain_keras --epochs 1`) + "
              f"{WORKER_STATES}x the state.",
    ), *hosts]


def conclude(tables: list[dict]) -> list[str]:
    """Per size: combining (the NaN check and the outer step) against the floor, each wire's communication,
    and every rank's peak against its budget."""
    lines = []
    for table in tables:
        rows = table["rows"]
        if "float16" in table["columns"]:
            lines += [hosts_line(rate, {name.split(", ")[0]: {k: v["median"] for k, v in f.items()}
                                        for name, f in rows.items() if name.endswith(f", {rate}")})
                      for rate in HOST_RATES if any(name.endswith(f", {rate}") for name in rows)]
        if "budget0" not in table["columns"]:
            continue
        for size in SIZES:
            named = {name.split(", ", 1)[1]: figures for name, figures in rows.items()
                     if name.startswith(f"{size.upper()} parameters, ")}
            if named:
                lines.append(size_line(size, {name: {k: v["median"] for k, v in f.items()} for name, f in
                                              named.items()}))
    return lines


def size_line(size: str, rows: dict[str, dict[str, float]]) -> str:
    """One size's findings from its rows (``"<wire> wire, outer <outer>[, through MPI]"`` -> figure -> median)."""
    nesterov = rows.get("float32 wire, outer nesterov", {})
    through_mpi = rows.get("float32 wire, outer nesterov, through MPI", {})
    nan = float("nan")
    rank0 = max(rows.values(), key=lambda f: f["rss0"] - f["budget0"])
    worker = max(rows.values(), key=lambda f: f["rss_workers"] - f["budget_workers"])
    return (f"At {size.upper()} parameters a round's communication + combining (float32 wire, outer Nesterov) "
            f"took {nesterov.get('overhead', nan):.3g} s: {nesterov.get('to_memory', nan):.2g}x the memory "
            f"bound (target 2x) and {nesterov.get('to_floor', nan):.2g}x the MPI floor (target 0.5x), of which "
            f"rank 0's combine alone takes {nesterov.get('combine_alone', nan):.3g} s on one thread; through "
            f"MPI's collectives {through_mpi.get('overhead', nan):.3g} s "
            f"({through_mpi.get('to_memory', nan):.2g}x and {through_mpi.get('to_floor', nan):.2g}x); peak RSS: "
            f"rank 0 up to {rank0['rss0']:.2f} GB against a budget of {rank0['budget0']:.2f} GB, a worker up "
            f"to {worker['rss_workers']:.2f} GB against {worker['budget_workers']:.2f} GB.")


def hosts_line(rate: str, rows: dict[str, dict[str, float]]) -> str:
    """One link speed's findings: each wire's communication per round, and what ``auto`` picked."""
    wires = ", ".join(f"{wire.split()[0]} {figures['comm']:.3g} s" for wire, figures in rows.items())
    auto = rows.get("auto wire")
    pick = "" if auto is None else f"; `auto` picked {'float16' if auto['float16'] else 'float32'}"
    return f"Between two hosts at {rate}, a 25M-parameter round's communication: {wires}{pick}."
