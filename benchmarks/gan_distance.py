"""A keras.io-style GAN: how far its generator's digits are from held-out ones, one training, as JSON.

    mpirun -n 3 python -m benchmarks.gan_distance --seed 0                  # mpi_trainer.fit, 2 workers
    mpirun -n 3 python -m benchmarks.gan_distance --outer nesterov --seed 0 # ... with the outer step forced
    python -m benchmarks.gan_distance --plain --seed 0                       # plain Keras model.fit

The model: a ``keras.Model`` subclass with its own ``compile(d_optimizer, g_optimizer, loss_fn)`` and a
``train_step`` with two gradient tapes (keras.io's "Customizing what happens in fit()" GAN) on
scikit-learn's 8x8 digits, 1,437 for training and 360 held out. The score is the sliced Wasserstein
distance between 360 generated digits and the 360 held-out ones (the mean over 256 random directions
of the 1-Wasserstein distance of the projections); the untrained generator's distance is printed
beside it. mpi_trainer trains at batch 32 per worker, plain Keras at batch 64. Under mpirun rank 0
also prints whether every rank ends with the same weights and optimizer moments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import numpy as np

LATENT = 16


def digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images = (load_digits().images / 16.0).astype("float32")[..., np.newaxis]
    return tuple(train_test_split(images, test_size=0.2, random_state=0))  # type: ignore[return-value]


def gan(seed: int) -> Any:
    import keras
    import tensorflow as tf
    from keras import layers, ops

    keras.utils.set_random_seed(seed)
    discriminator = keras.Sequential([keras.Input((8, 8, 1)), layers.Flatten(), layers.Dense(64),
                                      layers.LeakyReLU(negative_slope=0.2), layers.Dense(1)])
    generator = keras.Sequential([keras.Input((LATENT,)), layers.Dense(64), layers.LeakyReLU(negative_slope=0.2),
                                  layers.Dense(64, activation="sigmoid"), layers.Reshape((8, 8, 1))])

    class GAN(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.discriminator, self.generator = discriminator, generator
            self.seed_generator = keras.random.SeedGenerator(seed)
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer: Any, g_optimizer: Any, loss_fn: Any) -> None:
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        @property
        def metrics(self) -> list[Any]:
            return [self.d_loss_tracker, self.g_loss_tracker]

        def train_step(self, real: Any) -> dict[str, Any]:
            size = ops.shape(real)[0]
            noise = keras.random.normal((size, LATENT), seed=self.seed_generator)
            images = ops.concatenate([self.generator(noise), real], axis=0)
            labels = ops.concatenate([ops.ones((size, 1)), ops.zeros((size, 1))], axis=0)
            labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(images))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            noise = keras.random.normal((size, LATENT), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(ops.zeros((size, 1)), self.discriminator(self.generator(noise)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    model = GAN()
    model.compile(keras.optimizers.Adam(0.001), keras.optimizers.Adam(0.001),
                  keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def sliced_distance(first: np.ndarray, second: np.ndarray, directions: int = 256) -> float:
    """Mean over random unit directions of the 1-Wasserstein distance of the two sets' projections."""
    first, second = first.reshape(len(first), -1), second.reshape(len(second), -1)
    units = np.random.default_rng(0).normal(size=(first.shape[1], directions))
    units /= np.linalg.norm(units, axis=0)
    return float(np.mean(np.abs(np.sort(first @ units, axis=0) - np.sort(second @ units, axis=0))))


def distance(model: Any, held_out: np.ndarray) -> float:
    noise = np.random.default_rng(1).normal(size=(len(held_out), LATENT)).astype("float32")
    return sliced_distance(model.generator.predict(noise, verbose=0), held_out)


def same_everywhere(model: Any) -> bool:
    """Whether every rank holds the same weights and the same moments in both players' optimizers."""
    from mpi4py import MPI

    state = [np.asarray(v) for v in model.weights + model.d_optimizer.variables + model.g_optimizer.variables]
    digest = hashlib.sha256(b"".join(part.tobytes() for part in state)).hexdigest()
    return len(set(MPI.COMM_WORLD.allgather(digest))) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain", action="store_true", help="plain Keras model.fit in this one process")
    parser.add_argument("--outer", default="auto", help="aggregation.outer_optimizer under mpi_trainer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()
    import mpi_trainer

    placed = mpi_trainer.init(threads=1)
    x_train, x_test = digits()
    model = gan(args.seed)
    untrained = distance(model, x_test)
    if args.plain:
        model.fit(x_train, batch_size=64, epochs=args.epochs, verbose=0)
        same = True
    else:
        mpi_trainer.fit(model, x_train, batch_size=32, epochs=args.epochs, verbose=0,
                        overrides={"aggregation.outer_optimizer": args.outer, "log.verbosity": 0})
        same = same_everywhere(model)
    trained = distance(model, x_test)
    if placed.is_scheduler:
        print(json.dumps({"distance": trained, "untrained_distance": untrained, "same_on_every_rank": float(same)}),
              flush=True)


if __name__ == "__main__":
    main()
