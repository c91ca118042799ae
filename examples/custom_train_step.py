"""Customizing what happens in fit(): a model with its own train_step

As in keras.io's guide "Customizing what happens in fit() with TensorFlow": a ``keras.Model``
subclass overrides ``train_step(self, data)``, unpacks ``x, y = data``, computes the loss under a
``tf.GradientTape``, applies the gradients with ``self.optimizer`` and updates its own metric
trackers, listed in the ``metrics`` property so Keras resets them every epoch. A matching
``test_step`` makes ``evaluate`` report the same metrics.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, epochs=5, batch_size=32)
    +mpi_trainer.fit(model, x_train, y_train, epochs=5, batch_size=32)
"""

import os

os.environ["KERAS_BACKEND"] = "tensorflow"

import mpi_trainer  # noqa: E402

mpi_trainer.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(3)


class CustomModel(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy()

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)  # Forward pass
            loss = self.loss_fn(y, y_pred)
        # Compute gradients and update the weights
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        # Compute our own metrics
        self.loss_tracker.update_state(loss)
        self.accuracy_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "accuracy": self.accuracy_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(self.loss_fn(y, y_pred))
        self.accuracy_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "accuracy": self.accuracy_metric.result()}

    @property
    def metrics(self):
        # listed here, so that `reset_states()` is called on them at the start of each epoch
        return [self.loss_tracker, self.accuracy_metric]


digits = load_digits()
x = digits.data.astype("float32") / 16.0
x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=2)

inputs = keras.Input(shape=(64,))
hidden = layers.Dense(64, activation="relu")(inputs)
outputs = layers.Dense(10, activation="softmax")(hidden)
model = CustomModel(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.003))

mpi_trainer.fit(model, x_train, y_train, epochs=5, batch_size=32, verbose=2)

results = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
print(f"Held-out loss: {results['loss']:.4f}")
print(f"Test accuracy: {results['accuracy']:.4f}")
