"""The layout of a model's state: what is stepped, what is averaged, what is taken as it is."""

from __future__ import annotations

import keras
import numpy as np

from mpi_trainer.keras_fit.state import ModelState, model_optimizers


def test_trainable_weights_lead_and_batchnorm_statistics_and_moments_follow():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization()])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    model.optimizer.build(model.trainable_variables)
    state = ModelState(model)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    assert state.trainable_size == trainable == 3 * 2 + 2 + 2 + 2
    moving = sum(int(np.prod(v.shape)) for v in model.non_trainable_weights)
    moments = 2 * trainable + 1  # Adam's m and v, and the learning rate
    assert state.size == trainable + moving + moments
    assert [v.path for v in state.integers] == [model.optimizer.iterations.path]


def test_read_and_write_round_trip_and_the_learning_rate_stays_the_schedulers():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.5, momentum=0.9), "mse")
    model.optimizer.build(model.trainable_variables)
    state = ModelState(model)
    flat = state.read(state.empty())
    changed = flat + 1
    state.keep_rates(changed, flat)
    state.write(changed)
    assert float(model.optimizer.learning_rate) == 0.5  # kept
    np.testing.assert_allclose(state.read(state.empty()), changed)


class TwoOptimizers(keras.Model):
    """A GAN-style model: optimizers of its own besides (or instead of) model.optimizer."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.g_optimizer = keras.optimizers.Adam()
        self.d_optimizer = keras.optimizers.SGD()

    def call(self, x):
        return self.dense(x)


def test_optimizers_held_as_attributes_are_found_in_name_order():
    model = TwoOptimizers()
    model.compile(optimizer="rmsprop")
    found = model_optimizers(model)
    assert found[0] is model.optimizer and found[1:] == [model.d_optimizer, model.g_optimizer]
