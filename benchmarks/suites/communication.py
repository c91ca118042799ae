"""What does a round cost on the wire, and what does the scheduler burn while it waits?"""

from __future__ import annotations

import statistics

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import run_job

QUESTION = "Communication: bytes per round and the scheduler's waits"
WORKERS = 2


def traffic(method: str, epochs: int) -> Figures:
    """Bytes per round against the documented minimum: 2·M·W (average, weighted), M·(W+1) (best)."""
    summary, rounds, _ = run_job(WORKERS + 1, [f"aggregation.method={method}", f"train.epochs={epochs}"])
    model_bytes = summary["model_bytes"]
    minimum = model_bytes * (WORKERS + 1) if method == "best" else 2 * model_bytes * WORKERS
    measured = statistics.median(float(row["bytes"]) for row in rounds)
    return {"bytes": measured, "minimum": minimum, "ratio": measured / minimum}


def waiting(poll_interval: float, epochs: int, workers: int = WORKERS) -> Figures:
    summary, _, _ = run_job(workers + 1, [f"comm.poll_interval={poll_interval}", f"train.epochs={epochs}",
                                          "model.name=lenet"])
    return {"cpu_fraction": summary["scheduler_wait_cpu_fraction"], "wait_seconds": summary["scheduler_wait_seconds"],
            "wall_seconds": summary["wall_seconds"]}


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 3 if quick else 6
    flag = " --quick" if quick else ""
    return [
        Comparison(title=f"Bytes per round, MLP on digits, {WORKERS} workers, {epochs} rounds",
                   command=f"python -m benchmarks run communication{flag}",
                   variants={method: (lambda method=method: traffic(method, epochs))
                             for method in ("average", "weighted", "best")},
                   columns={"bytes": "measured bytes/round", "minimum": "minimum", "ratio": "measured / minimum"},
                   notes="Above the minimum: orders, arrival notices and reports (under 1 KiB)."),
        Comparison(title="Scheduler CPU while it waits, LeNet on digits",
                   command=f"python -m benchmarks run communication{flag}",
                   variants={f"{name}, {ranks}": (lambda poll=poll, n=n: waiting(poll, epochs, n))
                             for n, ranks in ((WORKERS, f"{WORKERS} workers (3 ranks on the cores)"),
                                              (1, "1 worker (one rank per core)"))
                             for name, poll in (("polling waits (default)", 0.005), ("blocking MPI waits", 0.0))},
                   columns={"cpu_fraction": "CPU per core while waiting", "wait_seconds": "wait s",
                            "wall_seconds": "training s"},
                   notes="Polling waits sleep `comm.poll_interval` (default 0.005 s) between tests; blocking waits "
                         "(`comm.poll_interval = 0`) call MPI's. Where a rank has a core to itself Open MPI's "
                         "blocking wait spins it, taking a core from the workers; with more ranks than cores it "
                         "yields between its polls."),
    ]


def conclude(tables: list[dict]) -> list[str]:
    """Why waits poll and sleep: the scheduler's CPU while waiting, polling against MPI's blocking waits."""
    for table in tables:
        if "cpu_fraction" not in table["columns"]:
            continue
        pairs = []
        for name, figures in table["rows"].items():
            if name.startswith("polling waits (default), "):
                blocking = table["rows"].get(name.replace("polling waits (default)", "blocking MPI waits"))
                if blocking is not None:
                    how = name.removeprefix("polling waits (default), ")
                    pairs.append(f"{figures['cpu_fraction']['median']:.3g} of a core where MPI's blocking waits "
                                 f"used {blocking['cpu_fraction']['median']:.3g} with {how}")
        if pairs:
            return ["Waits poll and sleep (`comm.poll_interval`) rather than block in MPI: while it waited, the "
                    "scheduler's polling used " + "; ".join(pairs) + "."]
    return []
