"""A subclassed model, built by its first batch

The model is a ``keras.Model`` subclass whose layers are created in ``__init__`` and wired in
``call``; it is never called or built before ``fit``, so its weights are created from the first
batch of training data. After training the script saves its weights and loads them into a new
instance, the usual way to persist a subclassed model.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=32, epochs=5)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=32, epochs=5)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(5)


class DigitClassifier(keras.Model):
    def __init__(self, hidden_units=(64, 32), num_classes=10, dropout=0.2, **kwargs):
        super().__init__(**kwargs)
        self.hidden = [layers.Dense(units, activation="relu") for units in hidden_units]
        self.dropout = layers.Dropout(dropout)
        self.classifier = layers.Dense(num_classes)

    def call(self, inputs, training=False):
        x = inputs
        for layer in self.hidden:
            x = layer(x)
            x = self.dropout(x, training=training)
        return self.classifier(x)


digits = load_digits()
x = digits.data.astype("float32") / 16.0
x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=4)

model = DigitClassifier()
model.compile(
    optimizer=keras.optimizers.Adam(2e-3),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
)
mpi_trainer.fit(model, x_train, y_train, batch_size=32, epochs=5, verbose=2)

model.save_weights("classifier.weights.h5")
restored = DigitClassifier()
restored(x_test[:1])  # create the weights
restored.load_weights("classifier.weights.h5")
np.testing.assert_allclose(restored.predict(x_test, verbose=0), model.predict(x_test, verbose=0), rtol=1e-5)

restored.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
loss, accuracy = restored.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
