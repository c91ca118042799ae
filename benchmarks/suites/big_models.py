"""Do big models run at the MPI floor: a round's work on rank 0 against moving the weights, per wire, and memory?"""

from __future__ import annotations

import json
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from benchmarks.harness import ROOT, Comparison, Figures
from benchmarks.jobs import ENV, JobFailed, after_first, mean, program, train_command
from mpi_trainer.persistence.run_files import read_rounds

QUESTION = "Big models: each phase of a round against the MPI floor, per wire dtype and outer optimizer, and peak RSS"
SIZES = {"25m": 99.0, "100m": 402.0}  # the MLP's float32 megabytes (benchmarks.big_mlp)
WIRES, OUTERS = ("float32", "float16"), ("none", "nesterov")
ROUNDS, STEPS = 3, 4  # rounds of a few local steps: the round's other phases are what is measured


@cache
def floor_seconds(megabytes: float) -> float:
    """Blocking MPI Reduce + Bcast of the model's bytes at 3 ranks (median of 3), in seconds."""
    result = program("transport_job", ["--payload-mb", str(megabytes), "--reps", "3"], ranks=3)
    return (result["Reduce"] + result["Bcast"]) / 1000


def overrides(size: str, wire: str, outer: str) -> list[str]:
    return [f"model.name=benchmarks.big_mlp:mlp_{size}", f"train.epochs={ROUNDS}", "train.batch_size=128",
            f"train.sync_every={STEPS}", "evaluation.every=1", "checkpoint.every=0", "log.plots=false",
            f"aggregation.wire_dtype={wire}", f"aggregation.outer_optimizer={outer}"]


def job(size: str, wire: str, outer: str) -> Figures:
    """One 3-rank job: rounds.csv's phases (rounds after the first), bytes, and every rank's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        run_dir, rss = Path(tmp) / "run", Path(tmp) / "rss"
        command = train_command(3, "configs/quickstart.toml", overrides(size, wire, outer), run_dir)
        at = command.index("-m")  # ... python -m mpi_trainer ARGS -> python -m benchmarks.peak_rss DIR mpi_trainer ARGS
        command[at:at + 2] = ["-m", "benchmarks.peak_rss", str(rss), "mpi_trainer"]
        proc = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True)
        if proc.returncode != 0:
            raise JobFailed(f"job failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        rounds = read_rounds(run_dir / "rounds.csv")
        peaks = {int(p["rank"]): p["peak_rss_gb"] for p in (json.loads(f.read_text()) for f in rss.glob("*.json"))}
    floor = floor_seconds(SIZES[size])
    aggregate = mean(after_first(rounds, "aggregate_seconds"))
    return {"floor": floor, "train": mean(after_first(rounds, "train_seconds_max")),
            "comm": mean(after_first(rounds, "comm_seconds")), "aggregate": aggregate,
            "eval": mean(after_first(rounds, "eval_seconds")), "ratio": aggregate / floor,
            "bytes": mean(after_first(rounds, "bytes")) / 1e6, "rss0": peaks.get(0, float("nan")),
            "rss_workers": max((v for k, v in peaks.items() if k), default=float("nan"))}


def comparisons(quick: bool) -> list[Comparison]:
    sizes = ["25m"] if quick else list(SIZES)
    flag = " --quick" if quick else ""
    return [Comparison(
        title="Seconds per round (mean of rounds 1-2) on 3 ranks; peak RSS of each rank",
        command=f"python -m benchmarks run big_models{flag} --repeats 1",
        variants={f"{size.upper()} parameters, {wire} wire, outer {outer}":
                  (lambda s=size, w=wire, o=outer: job(s, w, o))
                  for size in sizes for wire in WIRES for outer in OUTERS},
        columns={"floor": "MPI floor s (Reduce + Bcast)", "train": "training s", "comm": "communication s",
                 "aggregate": "outer step s", "ratio": "outer step / floor", "eval": "evaluation s",
                 "bytes": "MB per round", "rss0": "rank 0 peak GB", "rss_workers": "worker peak GB"},
        notes=f"MLPs of 3 hidden layers on digits (`benchmarks.big_mlp`), 2 workers, {ROUNDS} rounds of "
              f"{STEPS} local steps (`train.sync_every={STEPS}`), so that what a round does besides training "
              "shows; evaluation every round; no checkpoints. The floor is blocking MPI `Reduce` + `Bcast` "
              "of the float32 model at 3 ranks in the same run. Communication is the round's wall time "
              "outside training, the outer step and evaluation: the workers' flatten and encode, the "
              "reduction (for 16 bits, the segmented gather and the root's additions) and the broadcast.",
    )]
