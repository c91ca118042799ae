"""Custom layer, loss and metric, saved and loaded back

A script defines its own layer (with ``get_config``), its own loss function and its own metric
class, without registering them with ``register_keras_serializable``. After training it saves
the model to a ``.keras`` file and loads it back the way users do: once with ``custom_objects=``
to keep training state and metrics, once with ``compile=False`` for inference only.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=16, epochs=8, validation_split=0.1)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=16, epochs=8, validation_split=0.1)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402
from sklearn.datasets import load_wine  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

keras.utils.set_random_seed(11)


class ResidualDense(keras.layers.Layer):
    """``x + dense(x)``: a dense block with a skip connection."""

    def __init__(self, activation="relu", **kwargs):
        super().__init__(**kwargs)
        self.activation = keras.activations.get(activation)

    def build(self, input_shape):
        units = input_shape[-1]
        self.kernel = self.add_weight(shape=(units, units), initializer="glorot_uniform", name="kernel")
        self.bias = self.add_weight(shape=(units,), initializer="zeros", name="bias")

    def call(self, inputs):
        return inputs + self.activation(ops.matmul(inputs, self.kernel) + self.bias)

    def get_config(self):
        config = super().get_config()
        config.update({"activation": keras.activations.serialize(self.activation)})
        return config


def smoothed_crossentropy(y_true, y_pred):
    """Sparse categorical crossentropy with 10% label smoothing."""
    y_true = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"), 3)
    return keras.losses.categorical_crossentropy(y_true, y_pred, label_smoothing=0.1)


class MeanConfidence(keras.metrics.Metric):
    """The mean probability given to the true class."""

    def __init__(self, name="confidence", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.one_hot(ops.cast(ops.reshape(y_true, (-1,)), "int32"), 3)
        self.total.assign_add(ops.sum(y_true * y_pred))
        self.count.assign_add(ops.cast(ops.shape(y_pred)[0], "float32"))

    def result(self):
        return self.total / ops.maximum(self.count, 1.0)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)


x, y = load_wine(return_X_y=True)
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=5, stratify=y)
scaler = StandardScaler().fit(x_train)
x_train, x_test = scaler.transform(x_train).astype("float32"), scaler.transform(x_test).astype("float32")

model = keras.Sequential(
    [
        keras.Input((13,)),
        keras.layers.Dense(16, activation="relu"),
        ResidualDense(),
        keras.layers.Dense(3, activation="softmax"),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss=smoothed_crossentropy, metrics=["accuracy", MeanConfidence()])
mpi_trainer.fit(model, x_train, y_train, batch_size=16, epochs=8, validation_split=0.1, verbose=2)

model.save("wine_model.keras")
custom_objects = {
    "ResidualDense": ResidualDense,
    "smoothed_crossentropy": smoothed_crossentropy,
    "MeanConfidence": MeanConfidence,
}
reloaded = keras.models.load_model("wine_model.keras", custom_objects=custom_objects)
for_inference = keras.models.load_model(
    "wine_model.keras", compile=False, custom_objects={"ResidualDense": ResidualDense}
)
np.testing.assert_allclose(reloaded.predict(x_test, verbose=0), for_inference.predict(x_test, verbose=0), rtol=1e-6)

scores = reloaded.evaluate(x_test, y_test, verbose=0, return_dict=True)
print(f"Held-out confidence: {scores['confidence']:.4f}")
print(f"Test accuracy: {scores['accuracy']:.4f}")
