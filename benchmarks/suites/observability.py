"""What does seeing a run cost: TensorBoard events, the timeline and the end-of-run plots?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import run_job

QUESTION = "Observability: what seeing a run costs"
ALL_ON = ["log.tensorboard=true", "log.timeline=true", "log.plots=true"]
ALL_OFF = ["log.tensorboard=false", "log.timeline=false", "log.plots=false"]


def observed(switches: list[str], epochs: int) -> Figures:
    summary, _, seconds = run_job(3, [f"train.epochs={epochs}", *switches])
    return {"training_seconds": summary["wall_seconds"], "command_seconds": seconds}


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 5 if quick else 10
    return [Comparison(
        title=f"MLP on digits, 2 workers, {epochs} rounds",
        command=f"python -m benchmarks run observability{' --quick' if quick else ''}",
        variants={"TensorBoard, timeline and plots on": lambda: observed(ALL_ON, epochs),
                  "all off": lambda: observed(ALL_OFF, epochs)},
        columns={"training_seconds": "training s (summary.json)", "command_seconds": "whole command s"},
        notes="The whole command includes the start-up of every rank and the end-of-run report.")]
