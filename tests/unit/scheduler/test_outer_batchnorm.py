"""The outer step moves trainable weights only: BatchNormalization's moving statistics take the average.

A Nesterov step extrapolates each round's change; on a moving variance that falls fast (inputs of
small spread) it overshoots below zero, and the model then scores at chance without any error.
"""

from __future__ import annotations

import keras
import numpy as np
from local_job import run_local_job

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.persistence.checkpoint import load_checkpoint

NESTEROV = OuterSettings(name="nesterov", learning_rate=0.7, momentum=0.9)


def batchnorm_mlp(input_shape, num_classes):
    """A small MLP whose BatchNormalization statistics move fast (momentum 0.5)."""
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(16)(x)
    x = keras.layers.BatchNormalization(momentum=0.5)(x)
    x = keras.layers.Activation("relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))


def moving_variance(model, codec: WeightCodec, flat: np.ndarray) -> np.ndarray:
    index = next(i for i, v in enumerate(model.weights) if "moving_variance" in v.path)
    return codec.unflatten(flat)[index]


def test_the_spans_of_a_batchnorm_model_leave_out_its_moving_statistics():
    model = batchnorm_mlp((8, 8), 10)
    codec = WeightCodec.from_weights(model.get_weights())
    spans = codec.trainable_spans(model)
    # kernel, bias, gamma, beta | moving mean, moving variance | kernel, bias
    assert spans == [(0, 64 * 16 + 3 * 16), (64 * 16 + 5 * 16, codec.size)]
    assert sum(b - a for a, b in spans) == model.count_params() - 2 * 16


def test_a_real_batchnorm_model_keeps_a_positive_moving_variance_through_outer_steps():
    rng = np.random.default_rng(0)
    model = batchnorm_mlp((8, 8), 10)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
    codec = WeightCodec.from_weights(model.get_weights())
    stepped, everything = OuterOptimizer(NESTEROV, codec.trainable_spans(model)), OuterOptimizer(NESTEROV)
    x = (0.01 * rng.normal(size=(256, 8, 8))).astype(np.float32)  # a small spread: the variance falls fast
    y = rng.integers(0, 10, size=256)
    weights = unsafe = codec.flatten(model.get_weights())
    lowest_unsafe = np.inf
    for _ in range(4):
        trained = []
        for half in (slice(0, 128), slice(128, 256)):  # two workers from the same start
            model.set_weights(codec.unflatten(weights))
            model.fit(x[half], y[half], batch_size=32, epochs=1, verbose=0, shuffle=False)
            trained.append(codec.flatten(model.get_weights()))
        aggregate = (trained[0] + trained[1]) / np.float32(2)
        weights = stepped.step(weights, aggregate)
        unsafe = everything.step(unsafe, aggregate)  # the same aggregate, with every position stepped
        lowest_unsafe = min(lowest_unsafe, moving_variance(model, codec, unsafe).min())
        np.testing.assert_array_equal(moving_variance(model, codec, weights), moving_variance(model, codec, aggregate))
        assert moving_variance(model, codec, weights).min() > 0
    # stepping every position, as before, drove the same statistics below zero
    assert lowest_unsafe < 0


def test_the_engine_steps_the_trainable_weights_and_averages_the_moving_statistics(tmp_path):
    job = run_local_job(tmp_path, builder=batchnorm_mlp, model={"optimizer": "sgd", "learning_rate": 0.05},
                        train={"epochs": 3}, aggregation={"outer_optimizer": "nesterov", "outer_learning_rate": 0.7,
                                                          "outer_momentum": 0.9})
    engine = job.engine
    codec, model = engine.codec, engine.model
    spans = codec.trainable_spans(model)
    outer, weights = OuterOptimizer(NESTEROV, spans), engine.initial_weights
    for round_index in range(3):
        aggregate = np.float32(0.5) * job.trained(round_index)[0][1] + np.float32(0.5) * job.trained(round_index)[1][1]
        weights = outer.step(weights, aggregate)
        np.testing.assert_allclose(moving_variance(model, codec, weights), moving_variance(model, codec, aggregate),
                                   rtol=1e-6)
    np.testing.assert_allclose(engine.weights, weights, atol=2e-5)
    assert moving_variance(model, codec, engine.weights).min() > 0
    velocity = load_checkpoint(tmp_path / "checkpoint.h5")[0]["outer_velocity"]  # the run's end, checkpointed
    assert velocity.size == sum(b - a for a, b in spans)
    assert float(job.rounds()[-1]["test_accuracy"]) > 0.5
