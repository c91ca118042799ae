"""A GAN with its own compile() and train_step

In the style of keras.io's "DCGAN" and "Customizing what happens in fit()" GAN: a ``keras.Model``
subclass holds a discriminator and a generator, overrides ``compile(d_optimizer, g_optimizer,
loss_fn)`` (calling ``super().compile()``) and trains both networks in ``train_step`` with two
optimizers and two gradient tapes. It learns to draw 8x8 handwritten digits. The score is how
well the trained discriminator tells held-out real digits from generated ones.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -gan.fit(x_train, epochs=5, batch_size=64)
    +mpi_trainer.fit(gan, x_train, epochs=5, batch_size=64)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers, ops  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(123)
latent_dim = 16

digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
x_train, x_test = train_test_split(images, test_size=0.2, random_state=0)

discriminator = keras.Sequential(
    [
        keras.Input(shape=(8, 8, 1)),
        layers.Flatten(),
        layers.Dense(64),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Dense(1),
    ],
    name="discriminator",
)
generator = keras.Sequential(
    [
        keras.Input(shape=(latent_dim,)),
        layers.Dense(64),
        layers.LeakyReLU(negative_slope=0.2),
        layers.Dense(64, activation="sigmoid"),
        layers.Reshape((8, 8, 1)),
    ],
    name="generator",
)


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        # Train the discriminator on generated (label 1) and real (label 0) images
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(noise)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))

        # Train the generator to make the discriminator say "real"
        noise = keras.random.normal((batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(noise))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


gan = GAN(discriminator=discriminator, generator=generator, latent_dim=latent_dim)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.001),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.001),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
history = mpi_trainer.fit(gan, x_train, epochs=5, batch_size=64, verbose=2)
print("Final losses:", {name: round(values[-1], 4) for name, values in history.history.items()})

generator.save("generator.keras")
reloaded_generator = keras.models.load_model("generator.keras")
noise = np.random.default_rng(0).normal(size=(len(x_test), latent_dim)).astype("float32")
fakes = reloaded_generator.predict(noise, verbose=0)
real_logits = discriminator.predict(x_test, verbose=0)
fake_logits = discriminator.predict(fakes, verbose=0)
accuracy = (np.mean(real_logits < 0) + np.mean(fake_logits > 0)) / 2
print(f"Test discriminator_accuracy: {accuracy:.4f}")
