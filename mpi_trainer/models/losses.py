"""Losses on integer class labels for the choices ``model.loss`` and ``model.activation`` offer.

The model spec carries a loss by name; :func:`loss_by_name` turns these names into
the functions below on every rank, and leaves Keras' own names to Keras.
"""

from __future__ import annotations

import keras
from keras import ops


def _one_hot(y_true: keras.KerasTensor, y_pred: keras.KerasTensor) -> keras.KerasTensor:
    labels = ops.cast(ops.reshape(y_true, (-1,)), "int32")
    return ops.one_hot(labels, ops.shape(y_pred)[-1], dtype=y_pred.dtype)


def one_hot_squared_error(y_true: keras.KerasTensor, y_pred: keras.KerasTensor) -> keras.KerasTensor:
    """Mean squared error between the one-hot label and the output (the sibling system's squared error)."""
    return ops.mean(ops.square(_one_hot(y_true, y_pred) - y_pred), axis=-1)


def one_hot_binary_crossentropy(y_true: keras.KerasTensor, y_pred: keras.KerasTensor) -> keras.KerasTensor:
    """Per-class binary cross-entropy against the one-hot label, for sigmoid outputs."""
    return keras.losses.binary_crossentropy(_one_hot(y_true, y_pred), y_pred)


# The values of ``model.loss`` that are mpi_trainer's own names (anything else is a Keras identifier).
CONFIG_NAMES = ("cross_entropy", "squared_error")
SQUARED_ERROR = "one_hot_squared_error"
SIGMOID_CROSS_ENTROPY = "one_hot_binary_crossentropy"
BY_NAME = {SQUARED_ERROR: one_hot_squared_error, SIGMOID_CROSS_ENTROPY: one_hot_binary_crossentropy}


def loss_by_name(loss: object) -> object:
    """Our one-hot losses by name; anything else is passed to Keras unchanged."""
    return BY_NAME.get(loss, loss) if isinstance(loss, str) else loss
