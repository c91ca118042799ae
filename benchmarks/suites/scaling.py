"""How does throughput grow with the number of CPU workers on one node?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import after_first, mean, run_job

QUESTION = "Scaling: CPU workers on one node"


def workers(count: int, epochs: int, model: str) -> Figures:
    _, rounds, _ = run_job(count + 1, [f"train.epochs={epochs}", f"model.name={model}", "train.device=cpu"])
    samples, seconds = after_first(rounds, "samples"), after_first(rounds, "train_seconds_max")
    return {"samples_per_second": sum(samples) / sum(seconds),
            "seconds_per_round": mean(after_first(rounds, "wall_seconds"))}


def comparisons(quick: bool) -> list[Comparison]:
    epochs, model = (4, "mlp") if quick else (6, "lenet")
    return [Comparison(
        title=f"{model} on digits, {epochs} rounds of one local epoch, batch 32",
        command=f"python -m benchmarks run scaling{' --quick' if quick else ''}",
        variants={f"{n} worker{'s' if n > 1 else ''}": (lambda n=n: workers(n, epochs, model)) for n in (1, 2)},
        columns={"samples_per_second": "train samples/s", "seconds_per_round": "s per round + scoring"},
        notes="Samples/s of a round are its samples over its slowest worker's training time. On a node "
              "with fewer cores than workers the workers share them (train.threads divides the cores).")]
