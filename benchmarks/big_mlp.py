"""Big MLPs for the big_models suite: three hidden layers, as wide as a parameter count needs.

``model.name = "benchmarks.big_mlp:mlp_25m"`` (or ``mlp_100m``); on digits (64 inputs, 10 classes)
a width of 3,500 gives 24.8 M parameters (99 MB of float32) and 7,070 gives 100.5 M (402 MB).
"""

from __future__ import annotations

from typing import Any

WIDTHS = {"25m": 3_500, "100m": 7_070}


def mlp(input_shape: tuple[int, ...], num_outputs: int, width: int) -> Any:
    import keras

    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    for _ in range(3):
        x = keras.layers.Dense(width, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, activation="softmax")(x))


def mlp_25m(input_shape: tuple[int, ...], num_outputs: int) -> Any:
    return mlp(input_shape, num_outputs, WIDTHS["25m"])


def mlp_100m(input_shape: tuple[int, ...], num_outputs: int) -> Any:
    return mlp(input_shape, num_outputs, WIDTHS["100m"])
