"""The outer step ``auto`` takes for the user's model: Nesterov for Keras' own train_step with one
optimizer, plain averaging for a model with its own train_step or several optimizers."""

from __future__ import annotations

import keras
import numpy as np

from mpi_trainer.trainer.outer_choice import choose_outer, own_train_step


def dense() -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("adam", "mse")
    return model


class OwnStep(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):  # the keras.io pattern: a loss of its own, one optimizer
        return super().train_step(data)


class Gan(keras.Model):
    """Two players, each with its optimizer, and Keras' default model.optimizer left unused."""

    def __init__(self):
        super().__init__()
        self.generator, self.discriminator = keras.layers.Dense(3), keras.layers.Dense(1)

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    def call(self, x):
        return self.discriminator(self.generator(x))

    def train_step(self, data):
        return {}


def test_keras_own_train_step_with_one_optimizer_takes_the_configured_step():
    assert not own_train_step(dense())
    name, why = choose_outer("nesterov", True, dense())
    assert name == "nesterov" and "one optimizer" in why


def test_a_train_step_of_its_own_averages_plainly_and_says_why():
    model = OwnStep()
    model.compile("adam", "mse")
    model(np.zeros((1, 3), "float32"))
    assert own_train_step(model)
    name, why = choose_outer("nesterov", True, model)
    assert name == "none" and "OwnStep" in why and "train_step" in why


def test_a_gan_averages_plainly_naming_its_two_optimizers():
    model = Gan()
    model.compile(keras.optimizers.Adam(), keras.optimizers.SGD())
    name, why = choose_outer("nesterov", True, model)
    assert name == "none" and "2 optimizers" in why and "Adam" in why and "SGD" in why


def test_a_users_choice_and_one_worker_are_kept():
    model = Gan()
    model.compile(keras.optimizers.Adam(), keras.optimizers.SGD())
    assert choose_outer("nesterov", False, model) == ("nesterov", "set by aggregation.outer_optimizer")
    assert choose_outer("none", True, dense())[0] == "none"


def test_a_model_with_batchnorm_averages_plainly_naming_the_layers():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(1)])
    model.compile("adam", "mse")
    name, why = choose_outer("nesterov", True, model)
    assert name == "none" and "moving statistics (bn)" in why
    assert choose_outer("nesterov", False, model)[0] == "nesterov"  # the user's choice stands
