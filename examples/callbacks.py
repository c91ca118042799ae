"""Checkpoints, early stopping, learning-rate schedule and a CSV log

The usual set of callbacks: ``ModelCheckpoint(save_best_only=True)`` keeps the model with the
best validation loss, ``EarlyStopping(restore_best_weights=True)`` stops when it stops improving,
``ReduceLROnPlateau`` halves the learning rate on a plateau and ``CSVLogger`` writes one row per
epoch. After training the script loads the best checkpoint with ``load_model`` and scores it.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(x_train, y_train, epochs=8, batch_size=32, validation_split=0.2, callbacks=callbacks)
    +mpi_trainer.fit(model, x_train, y_train, epochs=8, batch_size=32, validation_split=0.2, callbacks=callbacks)
"""

import mpi_trainer

mpi_trainer.init()

import csv  # noqa: E402

import keras  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(6)

digits = load_digits()
x = digits.data.astype("float32") / 16.0
x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=11)

model = keras.Sequential(
    [
        keras.Input(shape=(64,)),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy", metrics=["accuracy"])

callbacks = [
    keras.callbacks.ModelCheckpoint("best_model.keras", monitor="val_loss", save_best_only=True),
    keras.callbacks.EarlyStopping(monitor="val_loss", patience=2, restore_best_weights=True),
    keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=1, min_lr=1e-4),
    keras.callbacks.CSVLogger("training_log.csv"),
]
history = mpi_trainer.fit(
    model, x_train, y_train, epochs=8, batch_size=32, validation_split=0.2, callbacks=callbacks, verbose=2
)
print("Epochs trained:", len(history.epoch))

with open("training_log.csv") as log:
    print("Logged epochs:", len(list(csv.DictReader(log))))
best_model = keras.models.load_model("best_model.keras")
loss, accuracy = best_model.evaluate(x_test, y_test, verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
