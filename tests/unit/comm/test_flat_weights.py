"""Flat weights into a Keras model: what Keras' set_weights would leave, every kind of variable included."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.comm.flat_weights import WeightCodec


def model_with_a_counter() -> keras.Model:
    """Dense layers (float32 kernels) and a layer with an int32 counter among its weights."""

    class Counted(keras.layers.Layer):
        def build(self, input_shape):
            self.calls = self.add_weight(shape=(), dtype="int32", initializer="zeros", trainable=False)

        def call(self, x):
            return x

    inputs = keras.Input((5,))
    x = keras.layers.Dense(7, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(Counted()(x)))


def test_load_leaves_what_set_weights_leaves_and_copies_the_flat_vector():
    model, reference = model_with_a_counter(), model_with_a_counter()
    codec = WeightCodec.from_weights(model.get_weights())
    flat = np.random.default_rng(0).normal(size=codec.size).astype(np.float32)
    counter = next(i for i, w in enumerate(model.weights) if "int" in str(w.dtype))
    flat[codec.offsets[counter]] = 4.0
    codec.load(model, flat)
    reference.set_weights(codec.unflatten(flat))
    for loaded, expected in zip(model.get_weights(), reference.get_weights(), strict=True):
        assert loaded.dtype == expected.dtype
        np.testing.assert_array_equal(loaded, expected)
    assert int(model.get_weights()[counter]) == 4
    flat[:] = 0.0  # the model holds its own copy, not a view of the vector
    assert np.abs(model.get_weights()[0]).max() > 0


def test_a_vector_of_another_model_is_refused_by_keras():
    codec = WeightCodec([(5, 7), (7,)])
    with pytest.raises(ValueError):
        codec.load(model_with_a_counter(), codec.empty())
