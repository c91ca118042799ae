"""What does one persistently slow worker cost, and what do SSP and rebalancing win back?"""

from __future__ import annotations

from benchmarks.data import mnist5k
from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import after_first, mean, run_job

QUESTION = "Stragglers: one worker slowed 2x"
# Rank 2 takes twice as long per batch (a test hook). Quick: every batch also sleeps 20 ms (simulated
# work, so that two workers on a 2-core machine measure scheduling rather than contention for the
# cores); otherwise LeNet on real MNIST, real compute only.
SLOWED = ["debug.slow_ranks=[2]", "debug.slow_factor=2.0", "aggregation.method=weighted"]
QUICK = ["debug.batch_delay=0.02"]
FULL = ["debug.batch_delay=0", "model.name=lenet", "data.validation_size=0.0", "model.learning_rate=0.0005"]
VARIANTS = {
    "BSP (s = 0)": [],
    "SSP s = 1": ["aggregation.ssp=1"],
    "SSP s = 2": ["aggregation.ssp=2"],
    "BSP + rebalance": ["data.rebalance=true"],
}


def idle_fractions(rounds: list[dict]) -> list[float]:
    """Each round's share of the workers' time not spent training: 1 - their training seconds over
    workers x the round's wall seconds."""
    fractions = []
    for row in rounds:
        seconds = [float(value) for value in str(row["worker_train_seconds"]).split(";") if value]
        fractions.append(1.0 - sum(seconds) / (len(seconds) * float(row["wall_seconds"])))
    return fractions


def straggler_run(extra: list[str], epochs: int, quick: bool) -> Figures:
    task = QUICK if quick else [*FULL, f"data.source={mnist5k()}"]
    summary, rounds, _ = run_job(3, [*SLOWED, *task, f"train.epochs={epochs}", "log.plots=false", *extra])
    return {"seconds_per_round": mean(after_first(rounds, "wall_seconds")),
            "idle_fraction": mean(idle_fractions(rounds)[1:]),
            "final_test_accuracy": summary["final_test_accuracy"]}


def comparisons(quick: bool) -> list[Comparison]:
    epochs, name = (5, "MLP on digits, 20 ms simulated work per batch") if quick else \
        (8, "LeNet on 5,000 real MNIST digits, real compute only")
    return [Comparison(
        title=f"{name}, 2 workers, rank 2 slowed 2x, {epochs} rounds",
        command=f"python -m benchmarks run stragglers{' --quick' if quick else ''}",
        variants={label: (lambda extra=extra: straggler_run(extra, epochs, quick))
                  for label, extra in VARIANTS.items()},
        columns={"seconds_per_round": "s per round after round 0", "idle_fraction": "idle fraction",
                 "final_test_accuracy": "final test accuracy"},
        notes="Equal-speed rounds would take 0.67x BSP's: the slowed worker's block shrinks to a third. SSP alone "
              "saves the first updates, then moves at the straggler's pace.")]
