"""Outer optimizers with plain numbers: exactness against averaging, hand-computed sequences, state."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import CHUNK, OuterOptimizer, OuterSettings


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


def test_a_checkpoint_of_another_outer_optimizer_or_another_size_starts_fresh_and_says_so(caplog):
    adam = OuterOptimizer(OuterSettings(name="adam", learning_rate=0.01))
    adam.step(f32(1, 2), f32(0, 0))
    nesterov = OuterOptimizer(OuterSettings(name="nesterov"))
    nesterov.load_state(adam.state_arrays(), 2)
    assert nesterov.state == {}
    # a checkpoint whose state covered the whole vector, read by an optimizer that steps 1 of 2 values
    other = OuterOptimizer(OuterSettings(name="adam"), trainable=[(0, 1)])
    with caplog.at_level("INFO", logger="mpi_trainer"):
        other.load_state(adam.state_arrays(), 2)
    assert other.state == {}
    assert "holds 2 values, the model's trainable weights 1" in caplog.text


def test_an_unknown_name_is_refused():
    with pytest.raises(ValueError, match="Received: name='sgd'"):
        OuterOptimizer(OuterSettings(name="sgd"))
    with pytest.raises(ValueError, match="Received: name='auto'"):  # the config resolves "auto" first
        OuterOptimizer(OuterSettings(name="auto"))


def reference_nesterov(weights, aggregate, velocity, lr, mu):
    """The outer Nesterov step written out on whole arrays (the formula the module's docstring gives)."""
    delta = weights - aggregate
    velocity = delta.copy() if velocity is None else mu * velocity + delta
    return aggregate - (lr * (delta + mu * velocity) - delta), velocity


def test_only_the_trainable_spans_take_the_step_the_others_take_the_aggregate_exactly():
    # positions 0-2 and 5-6 are trainable; 3-4 and 7 (say a moving mean and variance) are not
    trainable = [(0, 3), (5, 7)]
    positions = np.r_[0:3, 5:7]
    others = np.r_[3:5, 7:8]
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=0.5, momentum=0.5), trainable=trainable)
    w = f32(1, -2, 3, 1, 1, 4, -4, 1)
    aggregates = [f32(0, -1, 2, 0.5, 0.25, 3, -3, 0.1), f32(0.25, -1.5, 2, 0.2, 0.1, 2, -2, 0.01)]
    ref_w, velocity = w[positions], None
    for aggregate in aggregates:
        ref_w, velocity = reference_nesterov(ref_w, aggregate[positions], velocity, np.float32(0.5), np.float32(0.5))
        w = outer.step(w, aggregate)
        np.testing.assert_array_equal(bits(w[others]), bits(aggregate[others]))
        np.testing.assert_allclose(w[positions], ref_w, rtol=1e-6)
    # by hand, first position: round 1 delta 1, v 1, w = 0 - (0.5 * 1.5 - 1) = 0.25;
    # round 2 delta 0, v 0.5, w = 0.25 - (0.5 * 0.25 - 0) = 0.125
    assert w[0] == np.float32(0.125)
    assert outer.state["velocity"].shape == (5,)  # the state covers the trainable positions only
    np.testing.assert_allclose(outer.state["velocity"], velocity, rtol=1e-6)


@pytest.mark.parametrize("name", ["momentum", "nesterov", "adam"])
def test_the_in_place_chunked_step_matches_a_new_array_and_leaves_the_weights_alone(name):
    # longer than a chunk, with spans that cut chunks, so the state offsets are exercised
    size = 3 * CHUNK + 17
    trainable = [(5, CHUNK + 3), (CHUNK + 10, 3 * CHUNK)]
    rng = np.random.default_rng(2)
    settings = OuterSettings(name=name, learning_rate=0.7, momentum=0.9)
    fresh, in_place = OuterOptimizer(settings, trainable), OuterOptimizer(settings, trainable)
    start = rng.normal(size=size).astype(np.float32)
    aggregates = [(start + rng.normal(scale=0.1, size=size)).astype(np.float32) for _ in range(3)]
    w_fresh = w_in_place = start
    for aggregate in [a.copy() for a in aggregates]:
        before, kept = w_in_place, w_in_place.copy()
        w_fresh = fresh.step(w_fresh, aggregate.copy())
        w_in_place = in_place.step(w_in_place, aggregate, out=aggregate)
        assert w_in_place is aggregate
        np.testing.assert_array_equal(before, kept)  # the weights were read, not written
        np.testing.assert_array_equal(w_in_place, w_fresh)
    # the same numbers as a whole-vector optimizer over the trainable positions laid end to end
    positions = np.r_[5:CHUNK + 3, CHUNK + 10:3 * CHUNK]
    whole, w_whole = OuterOptimizer(settings), start[positions]
    for aggregate in aggregates:
        w_whole = whole.step(w_whole, aggregate[positions])
    np.testing.assert_array_equal(w_fresh[positions], w_whole)


def test_a_snapshot_keeps_the_state_the_in_place_step_changes():
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=0.5, momentum=0.5))
    outer.step(f32(1, 2), f32(0, 0))
    saved = outer.snapshot()
    outer.step(f32(1, 2), f32(0, 1))
    assert not np.array_equal(outer.state["velocity"], saved["velocity"])
    outer.restore(saved)
    np.testing.assert_array_equal(outer.state["velocity"], f32(1, 2))
