"""A tf.data input pipeline

Training data flow through a ``tf.data`` pipeline as the performance guide recommends: ``map``
a preprocessing function, ``cache`` the result, ``shuffle``, ``batch`` and ``prefetch``. The
validation data are a second dataset given as ``validation_data``.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(train_ds, epochs=5, validation_data=val_ds)
    +mpi_trainer.fit(model, train_ds, epochs=5, validation_data=val_ds)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(10)
AUTOTUNE = tf.data.AUTOTUNE
batch_size = 32

digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.images, digits.target, test_size=0.2, random_state=2)
x_train, x_val, y_train, y_val = train_test_split(x_train, y_train, test_size=0.15, random_state=2)


def preprocess(image, label):
    image = tf.cast(image, tf.float32) / 16.0
    return tf.reshape(image, (64,)), label


train_ds = (
    tf.data.Dataset.from_tensor_slices((x_train, y_train))
    .map(preprocess, num_parallel_calls=AUTOTUNE)
    .cache()
    .shuffle(1000)
    .batch(batch_size)
    .prefetch(AUTOTUNE)
)
val_ds = tf.data.Dataset.from_tensor_slices((x_val, y_val)).map(preprocess).batch(batch_size).cache().prefetch(AUTOTUNE)
test_ds = tf.data.Dataset.from_tensor_slices((x_test, y_test)).map(preprocess).batch(batch_size)

model = keras.Sequential(
    [
        keras.Input(shape=(64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
mpi_trainer.fit(model, train_ds, epochs=5, validation_data=val_ds, verbose=2)

loss, accuracy = model.evaluate(test_ds, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
