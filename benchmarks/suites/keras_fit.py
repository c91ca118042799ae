"""Does ``mpi_trainer.fit`` give Keras' arguments the effect ``model.fit`` gives them?"""

from __future__ import annotations

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import program, seeded

QUESTION = "`mpi_trainer.fit` against plain Keras `model.fit`: the same arguments, the same effect"


def class_weight(weights: str, plain: bool, epochs: int, seed: int) -> Figures:
    args = ["--weights", weights, "--seed", str(seed), "--epochs", str(epochs)]
    return program("class_weight", [*args, "--plain"] if plain else args, ranks=0 if plain else 3)


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 15 if quick else 30
    return [Comparison(
        title=f"`class_weight` on an imbalanced task: recall of the minority class, {epochs} epochs",
        command=f"python -m benchmarks run keras_fit{' --quick' if quick else ''}",
        variants={f"{runner}, {'balanced' if weights == 'balanced' else 'no'} class_weight": seeded(
                      lambda seed, weights=weights, plain=plain: class_weight(weights, plain, epochs, seed))
                  for weights in ("none", "balanced")
                  for runner, plain in (("mpi_trainer.fit (2 workers)", False), ("plain model.fit", True))},
        columns={"recall": "recall", "precision": "precision"},
        notes="scikit-learn's digits as \"is it a 7, 8 or 9?\" with those digits cut to a fifth (about 7 % "
              "positives), split 70/30 stratified; a 64-16-1 network, Adam 0.003; mpi_trainer at batch 16 per "
              "worker, plain Keras at batch 32, the same global batch. Repeat n runs with seed n (data split "
              "and initial weights). Recall and precision do not depend on the machine's load.")]
