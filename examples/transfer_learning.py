"""Transfer learning and fine-tuning

A small convolutional base is first trained to recognise the digits 0-4. It is then reused for a
new task, the digits 5-9: a new head is trained on top of the frozen base (``trainable = False``,
the base called with ``training=False`` so its BatchNormalization keeps its statistics), then the
base is unfrozen and the whole model recompiled with a much lower learning rate and fine-tuned,
as in keras.io's transfer learning guide.

Porting: two changes to the plain Keras script (every ``fit`` call)::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_new, y_new, epochs=3, batch_size=16, validation_split=0.2)
    +mpi_trainer.fit(model, x_new, y_new, epochs=3, batch_size=16, validation_split=0.2)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(8)

digits = load_digits()
images = (digits.images / 16.0).astype("float32")[..., np.newaxis]
old_task = digits.target < 5
x_old, y_old = images[old_task], digits.target[old_task]
x_new, x_test, y_new, y_test = train_test_split(
    images[~old_task], digits.target[~old_task] - 5, test_size=0.3, random_state=6
)

# The "pre-trained" base: trained on the digits 0-4
base_model = keras.Sequential(
    [
        keras.Input((8, 8, 1)),
        layers.Conv2D(16, 3, padding="same", activation="relu"),
        layers.BatchNormalization(momentum=0.9),
        layers.Conv2D(32, 3, activation="relu"),
        layers.GlobalAveragePooling2D(),
    ],
    name="base",
)
pretraining = keras.Sequential([base_model, layers.Dense(5, activation="softmax")])
pretraining.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
mpi_trainer.fit(pretraining, x_old, y_old, epochs=4, batch_size=16, verbose=2)

# New task: freeze the base, train a new head
base_model.trainable = False
inputs = keras.Input((8, 8, 1))
x = base_model(inputs, training=False)
x = layers.Dropout(0.2)(x)
outputs = layers.Dense(5, activation="softmax")(x)
model = keras.Model(inputs, outputs)
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
print("Trainable weights with a frozen base:", len(model.trainable_weights))
mpi_trainer.fit(model, x_new, y_new, epochs=3, batch_size=16, validation_split=0.2, verbose=2)

# Fine-tuning: unfreeze the base, recompile with a low learning rate
base_model.trainable = True
model.compile(optimizer=keras.optimizers.Adam(3e-4), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
print("Trainable weights when fine-tuning:", len(model.trainable_weights))
mpi_trainer.fit(model, x_new, y_new, epochs=2, batch_size=16, validation_split=0.2, verbose=2)

loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
