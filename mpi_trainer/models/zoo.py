"""Built-in models. Each is ``builder(input_shape, num_classes) -> keras.Model`` (uncompiled)."""

from __future__ import annotations

import keras
from keras import layers


def lenet(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The originating Keras "LeNet": 484,714 parameters on 28x28x1 inputs."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.Conv2D(32, 5, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Dropout(0.25),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="lenet",
    )


def mlp(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """A two-hidden-layer perceptron for small images and tabular data."""
    return keras.Sequential(
        [
            keras.Input(input_shape),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dense(64, activation="relu"),
            layers.Dense(num_classes, activation="softmax"),
        ],
        name="mlp",
    )


ZOO = {"lenet": lenet, "mlp": mlp}
