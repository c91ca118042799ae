"""What does one persistently slow worker cost, and what do SSP and rebalancing win back?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import after_first, mean, run_job

QUESTION = "Stragglers: one worker slowed 2x"
# Rank 2 takes twice as long per batch; every batch also sleeps 20 ms (simulated work, so that two
# workers on a 2-core machine measure scheduling rather than contention for the cores).
SLOWED = ["debug.slow_ranks=[2]", "debug.slow_factor=2.0", "debug.batch_delay=0.02", "aggregation.method=weighted"]
VARIANTS = {
    "BSP (s = 0)": [],
    "SSP s = 1": ["aggregation.ssp=1"],
    "BSP + rebalance": ["data.rebalance=true"],
    "SSP s = 2 + rebalance": ["aggregation.ssp=2", "data.rebalance=true"],
}


def straggler_run(extra: list[str], epochs: int) -> Figures:
    summary, rounds, _ = run_job(3, [*SLOWED, f"train.epochs={epochs}", *extra])
    return {"seconds_per_round": mean(after_first(rounds, "wall_seconds")),
            "idle_fraction": mean(after_first(rounds, "idle_fraction")),
            "final_test_accuracy": summary["final_test_accuracy"]}


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 5 if quick else 10
    return [Comparison(
        title=f"MLP on digits, 2 workers, rank 2 slowed 2x, {epochs} rounds",
        command=f"python -m benchmarks run stragglers{' --quick' if quick else ''}",
        variants={name: (lambda extra=extra: straggler_run(extra, epochs)) for name, extra in VARIANTS.items()},
        columns={"seconds_per_round": "s per round after round 0", "idle_fraction": "idle fraction",
                 "final_test_accuracy": "final test accuracy"},
        notes="Equal-speed rounds would take 0.67x BSP's: the slowed worker's block shrinks to a third.")]
