"""Models a user might point ``model.name`` at (``user_models:function`` with tests/ on PYTHONPATH)."""

from __future__ import annotations

import os

import keras
from keras import layers


def small_cnn(input_shape, num_classes):
    """Uncompiled: mpi_trainer compiles it from model.optimizer / model.learning_rate."""
    return keras.Sequential([
        keras.Input(input_shape),
        layers.Conv2D(8, 3, activation="relu", padding="same"),
        layers.Flatten(),
        layers.Dense(num_classes, activation="softmax"),
    ])


def compiled_sgd(input_shape, num_classes):
    """Compiled by the user: its optimizer and loss are kept."""
    model = keras.Sequential([keras.Input(input_shape), layers.Flatten(),
                              layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.123), loss="sparse_categorical_crossentropy")
    return model


def wrong_classes(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), layers.Flatten(), layers.Dense(num_classes + 1)])


def not_a_model(input_shape, num_classes):
    return "a string"


@keras.saving.register_keras_serializable(package="user_models")
class FailOnRank(layers.Layer):
    """Raises while training on the MPI rank named by MPI_TRAINER_TEST_FAIL_RANK (a test fixture)."""

    def call(self, inputs, training=False):
        failing_rank = os.environ.get("MPI_TRAINER_TEST_FAIL_RANK")
        if training and os.environ.get("OMPI_COMM_WORLD_RANK") == failing_rank:
            raise RuntimeError("injected failure in a user layer")
        return inputs


def fails_on_rank(input_shape, num_classes):
    return keras.Sequential([keras.Input(input_shape), FailOnRank(), layers.Flatten(),
                             layers.Dense(num_classes, activation="softmax")])


def compiled_one_hot(input_shape, num_outputs):
    """Compiled by the user for one-hot labels, with an extra metric (AUC)."""
    model = keras.Sequential([keras.Input(input_shape), layers.Flatten(), layers.Dense(32, activation="relu"),
                              layers.Dense(num_outputs, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="categorical_crossentropy",
                  metrics=["accuracy", keras.metrics.AUC(name="auc")])
    return model


def regressor(input_shape, num_outputs):
    """Uncompiled, one linear output per target column: model.loss and model.metrics compile it."""
    return keras.Sequential([keras.Input(input_shape), layers.Dense(32, activation="relu"),
                             layers.Dense(num_outputs)])
