"""Outer optimizers with plain numbers: exactness against averaging, hand-computed sequences, state."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def bits(array: np.ndarray) -> np.ndarray:
    return array.view(np.uint32)


@pytest.mark.parametrize("name", ["none", "momentum", "nesterov"])
def test_learning_rate_one_without_momentum_is_plain_averaging_bit_for_bit(name):
    rng = np.random.default_rng(0)
    outer = OuterOptimizer(OuterSettings(name=name, learning_rate=1.0, momentum=0.0))
    weights = rng.normal(size=1000).astype(np.float32)
    for _ in range(5):
        # aggregates far from and close to the weights, and a signed zero, where w - (w - a) != a in float32
        aggregate = (weights * rng.uniform(-3, 3, size=1000) + rng.normal(scale=1e-4, size=1000)).astype(np.float32)
        aggregate[:2] = f32(-0.0, 1e-30)
        weights = outer.step(weights, aggregate)
        np.testing.assert_array_equal(bits(weights), bits(aggregate))


def test_momentum_follows_the_hand_computed_sequence():
    outer = OuterOptimizer(OuterSettings(name="momentum", learning_rate=0.5, momentum=0.5))
    w = f32(1.0, -2.0)
    # round 1: delta = w - a = (1, -1); v = delta = (1, -1); w = 1 - 0.5 = 0.5, -2 + 0.5 = -1.5
    w = outer.step(w, f32(0.0, -1.0))
    np.testing.assert_allclose(w, f32(0.5, -1.5))
    # round 2: delta = (0.5, -1.5) - (0.25, -1.5) = (0.25, 0); v = 0.5 * (1, -1) + (0.25, 0) = (0.75, -0.5)
    # w = (0.5 - 0.375, -1.5 + 0.25) = (0.125, -1.25)
    w = outer.step(w, f32(0.25, -1.5))
    np.testing.assert_allclose(w, f32(0.125, -1.25))
    np.testing.assert_allclose(outer.state["velocity"], f32(0.75, -0.5))


def test_nesterov_follows_the_hand_computed_sequence():
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=0.5, momentum=0.5))
    w = f32(1.0, -2.0)
    # round 1: delta = (1, -1); v = (1, -1); step = delta + 0.5 v = (1.5, -1.5); w = (1 - 0.75, -2 + 0.75)
    w = outer.step(w, f32(0.0, -1.0))
    np.testing.assert_allclose(w, f32(0.25, -1.25))
    # round 2: delta = (0.25, -1.25) - (0.25, -1.5) = (0, 0.25); v = (0.5, -0.5) + (0, 0.25) = (0.5, -0.25)
    # step = (0, 0.25) + (0.25, -0.125) = (0.25, 0.125); w = (0.25 - 0.125, -1.25 - 0.0625)
    w = outer.step(w, f32(0.25, -1.5))
    np.testing.assert_allclose(w, f32(0.125, -1.3125))


def test_adam_follows_the_hand_computed_sequence():
    outer = OuterOptimizer(OuterSettings(name="adam", learning_rate=0.1, beta_1=0.5, beta_2=0.75, epsilon=0.0))
    w = f32(1.0, 1.0)
    # round 1: delta = (0.5, -0.25); m = 0.5 delta = (0.25, -0.125); v = 0.25 delta^2 = (0.0625, 0.015625)
    # alpha = 0.1 * sqrt(1 - 0.75) / (1 - 0.5) = 0.1; m / sqrt(v) = (1, -1): w = (0.9, 1.1)
    w = outer.step(w, f32(0.5, 1.25))
    np.testing.assert_allclose(w, f32(0.9, 1.1), rtol=1e-6)
    # round 2: delta = (0.9, 1.1) - (0.4, 1.1) = (0.5, 0); m = (0.375, -0.0625); v = (0.109375, 0.01171875)
    # alpha = 0.1 * sqrt(1 - 0.5625) / (1 - 0.25) = 0.1 * 0.6614378 / 0.75 = 0.0881917
    w = outer.step(w, f32(0.4, 1.1))
    m, v, alpha = np.array([0.375, -0.0625]), np.array([0.109375, 0.01171875]), 0.1 * np.sqrt(0.4375) / 0.75
    np.testing.assert_allclose(w, np.array([0.9, 1.1]) - alpha * m / np.sqrt(v), rtol=1e-6)
    assert int(outer.state["iterations"][0]) == 2


def test_state_round_trips_through_checkpoint_arrays_and_continues_identically():
    settings = OuterSettings(name="nesterov", learning_rate=0.7, momentum=0.9)
    rng = np.random.default_rng(1)
    sequence = [rng.normal(size=50).astype(np.float32) for _ in range(4)]
    straight, w_straight = OuterOptimizer(settings), np.zeros(50, np.float32)
    for aggregate in sequence:
        w_straight = straight.step(w_straight, aggregate)
    first, w = OuterOptimizer(settings), np.zeros(50, np.float32)
    for aggregate in sequence[:2]:
        w = first.step(w, aggregate)
    arrays = {"weights": w, **first.state_arrays()}
    assert sorted(arrays) == ["outer_velocity", "weights"]
    resumed = OuterOptimizer(settings)
    resumed.load_state(arrays, 50)
    for aggregate in sequence[2:]:
        w = resumed.step(w, aggregate)
    np.testing.assert_array_equal(w, w_straight)


def test_a_checkpoint_of_another_outer_optimizer_starts_fresh_and_a_wrong_size_is_refused():
    adam = OuterOptimizer(OuterSettings(name="adam", learning_rate=0.01))
    adam.step(f32(1, 2), f32(0, 0))
    nesterov = OuterOptimizer(OuterSettings(name="nesterov"))
    nesterov.load_state(adam.state_arrays(), 2)
    assert nesterov.state == {}
    other = OuterOptimizer(OuterSettings(name="adam"))
    with pytest.raises(ValueError, match="holds 2 values, the model has 3"):
        other.load_state(adam.state_arrays(), 3)


def test_an_unknown_name_is_refused():
    with pytest.raises(ValueError, match="Received: name='sgd'"):
        OuterOptimizer(OuterSettings(name="sgd"))
    with pytest.raises(ValueError, match="Received: name='auto'"):  # the config resolves "auto" first
        OuterOptimizer(OuterSettings(name="auto"))
