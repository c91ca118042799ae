"""Serving batches with a keras.utils.PyDataset

A ``keras.utils.PyDataset`` subclass serves the training batches: ``__len__`` says how many
batches an epoch has, ``__getitem__`` builds one (scaling the pixels and adding a little noise,
as an augmentation would) and ``on_epoch_end`` reshuffles the rows. A second PyDataset serves the
validation batches.

Porting: two changes to the plain Keras script::

    +import mpi_trainer
    +mpi_trainer.init()
     import keras
     ...
    -model.fit(train_data, validation_data=val_data, epochs=5)
    +mpi_trainer.fit(model, train_data, validation_data=val_data, epochs=5)
"""

import mpi_trainer

mpi_trainer.init()

import math  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

keras.utils.set_random_seed(12)


class DigitsDataset(keras.utils.PyDataset):
    def __init__(self, images, labels, batch_size, noise=0.0, shuffle=False, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.images, self.labels = images, labels
        self.batch_size, self.noise, self.shuffle = batch_size, noise, shuffle
        self.rng = np.random.default_rng(seed)
        self.order = np.arange(len(images))

    def __len__(self):
        return math.ceil(len(self.images) / self.batch_size)

    def __getitem__(self, idx):
        rows = self.order[idx * self.batch_size : (idx + 1) * self.batch_size]
        batch_x = self.images[rows].reshape(len(rows), -1).astype("float32") / 16.0
        if self.noise:
            batch_x = np.clip(batch_x + self.rng.normal(0, self.noise, batch_x.shape), 0, 1).astype("float32")
        return batch_x, self.labels[rows]

    def on_epoch_end(self):
        if self.shuffle:
            self.rng.shuffle(self.order)


digits = load_digits()
x_train, x_test, y_train, y_test = train_test_split(digits.images, digits.target, test_size=0.2, random_state=7)
x_train, x_val, y_train, y_val = train_test_split(x_train, y_train, test_size=0.15, random_state=7)
train_data = DigitsDataset(x_train, y_train, batch_size=32, noise=0.05, shuffle=True)
val_data = DigitsDataset(x_val, y_val, batch_size=64)

model = keras.Sequential(
    [
        keras.Input(shape=(64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)
model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
mpi_trainer.fit(model, train_data, validation_data=val_data, epochs=5, verbose=2)

loss, accuracy = model.evaluate(DigitsDataset(x_test, y_test, batch_size=64), verbose=0)
print(f"Test accuracy: {accuracy:.4f}")
