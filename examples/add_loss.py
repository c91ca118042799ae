"""Losses added by layers with add_loss()

A layer can add a loss of its own: here a variational bottleneck, a ``Sampling`` layer that draws
``z`` from ``(z_mean, z_log_var)`` while training and calls ``self.add_loss(...)`` with the KL
divergence to a unit Gaussian, as the encoder of keras.io's VAE does. Keras adds it to the
compiled classification loss; the model classifies the digits through the noisy bottleneck.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, epochs=4, batch_size=32)
    +mpi_trainer.fit(model, x_train, y_train, epochs=4, batch_size=32)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
from keras import layers, ops  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(4)


class Sampling(layers.Layer):
    """Draws z from (z_mean, z_log_var) while training; adds the KL divergence as a loss."""

    def __init__(self, kl_weight=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.kl_weight = kl_weight
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs, training=False):
        z_mean, z_log_var = inputs
        kl = -0.5 * ops.mean(ops.sum(1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var), axis=1))
        self.add_loss(self.kl_weight * kl)
        if not training:
            return z_mean
        epsilon = keras.random.normal(ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


digits = load_digits()
x = digits.data.astype("float32") / 16.0
x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=9)

inputs = keras.Input(shape=(64,))
h = layers.Dense(64, activation="relu")(inputs)
z_mean = layers.Dense(8, name="z_mean")(h)
z_log_var = layers.Dense(8, name="z_log_var")(h)
z = Sampling(name="sampling")([z_mean, z_log_var])
outputs = layers.Dense(10, activation="softmax")(z)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

mpi_trainer.fit(model, x_train, y_train, epochs=4, batch_size=32, verbose=2)

print("Losses added by layers:", len(model.losses))
loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
