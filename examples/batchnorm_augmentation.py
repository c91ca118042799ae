"""Batch normalization and data augmentation inside the model

Raw uint8 images go straight into the model: a ``Rescaling`` layer scales them, a ``Reshape``
adds the channel axis, ``RandomTranslation`` and ``RandomZoom`` augment them while training only,
and the convolutional blocks use ``BatchNormalization`` and ``Dropout``. The script does no
preprocessing of its own, so the saved model takes raw images too.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, epochs=4, batch_size=64, validation_data=(x_val, y_val))
    +mpi_trainer.fit(model, x_train, y_train, epochs=4, batch_size=64, validation_data=(x_val, y_val))
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(7)

digits = load_digits()
images = digits.images.astype("uint8")  # pixel values 0-16, no channel axis: shape (n, 8, 8)
x_train, x_test, y_train, y_test = train_test_split(images, digits.target, test_size=0.2, random_state=1)
x_train, x_val, y_train, y_val = train_test_split(x_train, y_train, test_size=0.15, random_state=1)

augmentation = keras.Sequential(
    [layers.RandomTranslation(0.1, 0.1), layers.RandomZoom(0.1)],
    name="augmentation",
)

inputs = keras.Input((8, 8), dtype="uint8")
x = layers.Rescaling(1 / 16.0)(inputs)
x = layers.Reshape((8, 8, 1))(x)
x = augmentation(x)
for filters in (16, 32):
    x = layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization(momentum=0.9)(x)
    x = layers.Activation("relu")(x)
x = layers.MaxPooling2D()(x)
x = layers.Flatten()(x)
x = layers.Dropout(0.25)(x)
outputs = layers.Dense(10, activation="softmax")(x)
model = keras.Model(inputs, outputs)

model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy"],
)
mpi_trainer.fit(model, x_train, y_train, epochs=4, batch_size=64, validation_data=(x_val, y_val), verbose=2)

model.save("digits_bn.keras")
reloaded = keras.models.load_model("digits_bn.keras")
probabilities = reloaded.predict(x_test[:5], verbose=0)
print("Predicted:", np.argmax(probabilities, axis=1), "true:", y_test[:5])
loss, accuracy = reloaded.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
