"""Structured data with an adapted Normalization layer

The breast cancer measurements have features on very different scales. Instead of scaling them
outside the model, a ``keras.layers.Normalization`` layer is adapted on the training features
(it learns their mean and variance) and sits first in the model, so the saved model takes the raw
measurements.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, epochs=8, batch_size=32, validation_split=0.2)
    +mpi_trainer.fit(model, x_train, y_train, epochs=8, batch_size=32, validation_split=0.2)
"""

import mpi_trainer

mpi_trainer.init()

import keras  # noqa: E402
from sklearn.datasets import load_breast_cancer  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(17)

data = load_breast_cancer()
x_train, x_test, y_train, y_test = train_test_split(
    data.data.astype("float32"), data.target, test_size=0.25, random_state=3, stratify=data.target
)
print("Feature ranges:", x_train.min(axis=0)[:4], x_train.max(axis=0)[:4])

normalizer = keras.layers.Normalization(axis=-1)
normalizer.adapt(x_train)

model = keras.Sequential(
    [
        keras.Input(shape=(x_train.shape[1],)),
        normalizer,
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(1, activation="sigmoid"),
    ]
)
model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy", keras.metrics.AUC(name="auc")])
mpi_trainer.fit(model, x_train, y_train, epochs=8, batch_size=32, validation_split=0.2, verbose=2)

model.save("cancer.keras")
reloaded = keras.models.load_model("cancer.keras")
results = reloaded.evaluate(x_test, y_test, verbose=0, return_dict=True)
print(f"Held-out AUC: {results['auc']:.4f}")
print(f"Test accuracy: {results['accuracy']:.4f}")
