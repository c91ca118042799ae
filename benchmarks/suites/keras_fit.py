"""Does ``mpi_trainer.fit`` give Keras' arguments the effect ``model.fit`` gives them?"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.harness import Comparison, Figures
from benchmarks.jobs import program, seeded

QUESTION = "`mpi_trainer.fit` against plain Keras `model.fit`: the same arguments, the same effect"


def class_weight(weights: str, plain: bool, epochs: int, seed: int) -> Figures:
    args = ["--weights", weights, "--seed", str(seed), "--epochs", str(epochs)]
    return program("class_weight", [*args, "--plain"] if plain else args, ranks=0 if plain else 3)


def plain_or_fit(module: str, outer: str | None, args: list[str]) -> Figures:
    """``benchmarks.<module>``: plain Keras in one process (``outer`` None), else mpi_trainer.fit on 2 workers
    with ``aggregation.outer_optimizer = outer``."""
    if outer is None:
        return program(module, [*args, "--plain"])
    return program(module, [*args, "--outer", outer], ranks=3)


def batchnorm_cnn(outer: str | None, epochs: int, seed: int) -> Figures:
    return plain_or_fit("batchnorm_cnn", outer, ["--seed", str(seed), "--epochs", str(epochs)])


def mnist_batchnorm_cnn(outer: str | None, seed: int) -> Figures:
    return plain_or_fit("batchnorm_cnn", outer, ["--mnist", "--seed", str(seed), "--epochs", "8"])


def gan_distance(outer: str | None, epochs: int, seed: int) -> Figures:
    return plain_or_fit("gan_distance", outer, ["--seed", str(seed), "--epochs", str(epochs)])


def outer_variants(measure: Callable[[str | None, int], Figures]) -> dict[str, Callable[[], Figures]]:
    """mpi_trainer.fit with the defaults (for a BatchNorm model: plain averaging) and with the Nesterov step
    forced, and plain Keras; repeat n with seed n."""
    return {name: seeded(lambda seed, outer=outer: measure(outer, seed))
            for name, outer in (("mpi_trainer.fit (2 workers), defaults", "auto"),
                                ("mpi_trainer.fit (2 workers), outer optimizer nesterov", "nesterov"),
                                ("plain model.fit", None))}


def comparisons(quick: bool) -> list[Comparison]:
    epochs = 15 if quick else 30
    cnn_epochs = 10 if quick else 20
    return [batchnorm_comparison(cnn_epochs, quick), mnist_batchnorm_comparison(quick),
            gan_comparison(50 if quick else 100, quick), Comparison(
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


def batchnorm_comparison(epochs: int, quick: bool) -> Comparison:
    return Comparison(
        title=f"A BatchNormalization CNN on uint8 images: held-out accuracy after {epochs} epochs",
        command=f"python -m benchmarks run keras_fit{' --quick' if quick else ''}",
        variants=outer_variants(lambda outer, seed: batchnorm_cnn(outer, epochs, seed)),
        columns={"accuracy": "accuracy", "seconds": "seconds"},
        notes="scikit-learn's digits as uint8 8x8 images, 1,400 training and 397 held out; the model rescales "
              "inside (Rescaling(1/255)), two Conv-BatchNorm-ReLU blocks, dropout; Adam 0.002; mpi_trainer at "
              "batch 32 per worker, plain Keras at batch 64. BatchNorm's moving statistics are combined as one "
              "process holds them after both workers' batches, never stepped by the outer optimizer; `auto` takes "
              "no outer step for a BatchNorm model. Repeat n runs with seed n (initial weights).")


def mnist_batchnorm_comparison(quick: bool) -> Comparison:
    return Comparison(
        title="A BatchNormalization CNN with augmentation on 4,000 real MNIST digits: held-out accuracy after 8 "
              "epochs",
        command=f"python -m benchmarks run keras_fit{' --quick' if quick else ''}",
        variants=outer_variants(mnist_batchnorm_cnn),
        columns={"accuracy": "accuracy", "seconds": "seconds"},
        notes="4,000 real MNIST digits for training, 1,000 held out (the bench extra's copy); Rescaling, "
              "RandomTranslation and RandomZoom inside the model, two Conv-BatchNorm(momentum 0.99)-ReLU-MaxPool "
              "blocks, dropout; Adam 0.002; mpi_trainer at batch 32 per worker, plain Keras at batch 64. The "
              "moving statistics are combined as one process holds them after both workers' batches "
              "(docs/keras.md); a plain mean of the workers' statistics lags by the factor of the workers. `auto` "
              "takes no outer step for a BatchNorm model.")


def gan_comparison(epochs: int, quick: bool) -> Comparison:
    return Comparison(
        title=f"A keras.io-style GAN (two optimizers, its own train_step) on digits: distance of its samples to "
              f"held-out digits after {epochs} epochs (lower is better)",
        command=f"python -m benchmarks run keras_fit{' --quick' if quick else ''}",
        variants={name: seeded(lambda seed, outer=outer: gan_distance(outer, epochs, seed))
                  for name, outer in (("mpi_trainer.fit (2 workers), defaults", "auto"),
                                      ("mpi_trainer.fit (2 workers), outer optimizer nesterov", "nesterov"),
                                      ("plain model.fit", None))},
        columns={"distance": "sliced Wasserstein distance", "untrained_distance": "untrained generator's",
                 "same_on_every_rank": "same state on every rank"},
        notes="scikit-learn's digits, 1,437 for training and 360 held out; the distance is the sliced "
              "1-Wasserstein distance between 360 generated and the 360 held-out digits (256 random "
              "directions). Under the defaults `auto` takes plain averaging for a model that steps several "
              "optimizers; the second row forces the outer Nesterov step. Both players' optimizers are "
              "built before the first round, so their moments are combined and the same on every rank.")
