"""Imbalanced classification with class weights

One digit against all the others is a 1-in-10 problem: a model can be 90% accurate by never
predicting it. ``class_weight`` gives the rare class as much total weight in the loss as the
common one (weights computed from the class counts, as in keras.io's "Imbalanced
classification" example), and the script reports the recall on held-out images.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, batch_size=64, epochs=5, class_weight=class_weight)
    +mpi_trainer.fit(model, x_train, y_train, batch_size=64, epochs=5, class_weight=class_weight)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(14)

digits = load_digits()
x = digits.data.astype("float32") / 16.0
y = (digits.target == 8).astype("int64")  # is it an eight?
x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=15, stratify=y)

counts = np.bincount(y_train)
print(f"Positive samples in training data: {counts[1]} ({100 * counts[1] / len(y_train):.1f}% of the total)")
class_weight = {0: len(y_train) / (2 * counts[0]), 1: len(y_train) / (2 * counts[1])}
print("Class weights:", class_weight)

model = keras.Sequential(
    [
        keras.Input(shape=(64,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss="binary_crossentropy",
    metrics=[keras.metrics.Recall(name="recall"), keras.metrics.Precision(name="precision")],
)
mpi_trainer.fit(model, x_train, y_train, batch_size=64, epochs=5, class_weight=class_weight, verbose=2)

results = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
print(f"Held-out precision: {results['precision']:.4f}")
print(f"Test recall: {results['recall']:.4f}")
