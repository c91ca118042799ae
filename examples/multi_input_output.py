"""A functional model with named inputs and outputs

Two inputs, given to ``fit`` as a dict keyed by the ``Input`` names: the digit image and a few
summary features computed from it. Two outputs, each with its own loss and metric, keyed by the
output layers' names: the digit (classification) and the amount of ink in the image
(regression). The losses are weighted so that the classification leads.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit({"image": ..., "stats": ...}, {"digit": ..., "ink": ...}, epochs=5, batch_size=32)
    +mpi_trainer.fit(model, {"image": ..., "stats": ...}, {"digit": ..., "ink": ...}, epochs=5, batch_size=32)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import layers  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(19)

digits = load_digits()
images = (digits.images / 16.0).astype("float32")
stats = np.concatenate([images.mean(axis=1), images.mean(axis=2)], axis=1)  # column and row means
ink = images.sum(axis=(1, 2), keepdims=False)[:, None] / 64.0
split = train_test_split(images, stats, digits.target, ink, test_size=0.25, random_state=16)
img_train, img_test, stats_train, stats_test, digit_train, digit_test, ink_train, ink_test = split

image_input = keras.Input(shape=(8, 8), name="image")
stats_input = keras.Input(shape=(16,), name="stats")
image_features = layers.Dense(32, activation="relu")(layers.Flatten()(image_input))
stats_features = layers.Dense(16, activation="relu")(stats_input)
x = layers.concatenate([image_features, stats_features])
digit_output = layers.Dense(10, activation="softmax", name="digit")(x)
ink_output = layers.Dense(1, name="ink")(x)
model = keras.Model(
    inputs={"image": image_input, "stats": stats_input}, outputs={"digit": digit_output, "ink": ink_output}
)

model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss={"digit": "sparse_categorical_crossentropy", "ink": "mse"},
    loss_weights={"digit": 1.0, "ink": 0.5},
    metrics={"digit": ["accuracy"], "ink": ["mae"]},
)
mpi_trainer.fit(
    model,
    {"image": img_train, "stats": stats_train},
    {"digit": digit_train, "ink": ink_train},
    epochs=5,
    batch_size=32,
    verbose=2,
)

results = model.evaluate(
    {"image": img_test, "stats": stats_test}, {"digit": digit_test, "ink": ink_test}, verbose=0, return_dict=True
)
print("Held-out results:", {name: round(float(value), 4) for name, value in results.items()})
print(f"Test digit_accuracy: {results['digit_accuracy']:.4f}")
