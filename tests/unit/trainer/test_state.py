"""The layout of a model's state: what is stepped, what is averaged, what is taken as it is."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.trainer.state import ModelState, build_optimizers, model_optimizers, optimizer_rules


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



def test_a_written_state_is_the_models_own_through_training_and_later_writes():
    """The model keeps none of the caller's array, trains from what was written, and a later write lands
    whether or not the variables still hold the buffers the last write handed them (kept at most two each)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state = ModelState(model)
    x, y = np.random.default_rng(0).normal(size=(2, 16, 4)).astype("float32")[0], np.zeros((16, 2), "float32")
    for value in (1.0, 2.0, 3.0, 4.0):
        flat = state.empty() + np.float32(value)
        state.write(flat)
        flat[:] = -7.0  # the caller's array is its own again
        np.testing.assert_array_equal(state.read(state.empty()), value)
        before = state.read(state.empty())
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)
        after = state.read(state.empty())
        assert not np.array_equal(after, before) and np.all(np.isfinite(after))  # trained from the state written
        np.testing.assert_array_equal(before, value)  # a read taken before training is left as it was
    assert all(len(kept) <= 2 for kept in state.handed.kept.values())


def test_prepared_writes_leave_the_state_and_fill_only_the_buffers_made_beforehand():
    """A rank that writes its model seldom makes the buffers its writes fill before the rounds: the state is as
    it was, and no later write, with training between them, makes a buffer of its own."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state = ModelState(model)
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    before = state.read(state.empty())
    state.prepare_writes()
    np.testing.assert_array_equal(state.read(state.empty()), before)
    made = {index: [id(buffer) for buffer in kept] for index, kept in state.handed.kept.items()}
    assert len(made) == len(state.floats) and all(len(ids) == 2 for ids in made.values())
    for value in (1.0, 2.0, 3.0):
        state.write(state.empty() + np.float32(value))
        np.testing.assert_array_equal(state.read(state.empty()), value)
        model.fit(x, y, epochs=1, batch_size=8, verbose=0)
    assert {index: [id(buffer) for buffer in kept] for index, kept in state.handed.kept.items()} == made


def test_the_model_holds_a_state_only_when_every_value_is_the_same():
    """Rank 0 sends the state only when its model's differs from what the workers hold: one changed value, in
    any chunk of any variable, or a NaN, tells."""
    model = keras.Sequential([keras.Input((300,)), keras.layers.Dense(200), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state = ModelState(model)
    flat = np.random.default_rng(2).normal(size=state.size).astype(np.float32)
    state.write(flat)
    assert state.holds(flat)
    for position in (0, 70_000, state.trainable_size + 5, state.size - 1):  # 70,000: past the first chunk
        changed = flat.copy()
        changed[position] += 1.0
        assert not state.holds(changed), position
    flat[3] = np.nan
    state.write(flat)
    assert not state.holds(flat)


def test_a_state_arriving_part_by_part_is_written_a_variable_at_a_time_once_its_values_are_in():
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(20), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state = ModelState(model)
    before = state.read(state.empty())
    arriving = np.random.default_rng(3).normal(size=state.size).astype(np.float32)
    flat = state.empty()
    writing = state.arriving(flat)
    kernel_end = int(state.offsets[1])  # the first variable: the first Dense's kernel
    flat[:kernel_end - 1] = arriving[:kernel_end - 1]
    writing(0, kernel_end - 1)  # one value short of the first variable: nothing written
    np.testing.assert_array_equal(state.read(state.empty()), before)
    flat[kernel_end - 1:kernel_end + 5] = arriving[kernel_end - 1:kernel_end + 5]
    writing(kernel_end - 1, kernel_end + 5)
    np.testing.assert_array_equal(model.layers[0].kernel.numpy().reshape(-1), arriving[:kernel_end])
    np.testing.assert_array_equal(state.read(state.empty())[kernel_end:], before[kernel_end:])
    assert writing.written == 1
    flat[kernel_end + 5:] = arriving[kernel_end + 5:]
    writing(kernel_end + 5, state.size)
    assert writing.written == len(state.floats)
    flat[:] = 0.0  # the model keeps none of the buffer
    np.testing.assert_array_equal(state.read(state.empty()), arriving)


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


def test_each_optimizers_moments_combine_by_its_own_decay_and_counts_its_own_steps():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.BatchNormalization(momentum=0.7)])
    model.compile(keras.optimizers.Adam(beta_1=0.8, beta_2=0.95), "mse")
    model.optimizer.build(model.trainable_variables)
    state = ModelState(model)
    rules = {v.path: rule for v, rule in zip(state.floats, state.rules)}
    bn = model.layers[1]
    assert rules[bn.moving_mean.path] == rules[bn.moving_variance.path]
    assert rules[bn.moving_mean.path].kind == "moving" and rules[bn.moving_mean.path].clock == 0
    assert rules[bn.moving_mean.path].decay == pytest.approx(0.7)
    assert [rules[v.path].decay for v in model.optimizer._momentums] == pytest.approx([0.8] * 4)
    assert [rules[v.path].decay for v in model.optimizer._velocities] == pytest.approx([0.95] * 4)
    assert {rules[v.path].kind for v in model.trainable_weights} == {"mean"}
    assert state.counters == {0: 1}  # the optimizer's iterations count its steps


@pytest.mark.parametrize("optimizer, slots, kind, decay", [
    (keras.optimizers.SGD(momentum=0.9), "momentums", "moving", 0.9),
    (keras.optimizers.RMSprop(rho=0.8), "_velocities", "moving", 0.8),
    (keras.optimizers.Adagrad(), "_accumulators", "sum", 0.0),
    (keras.optimizers.AdamW(beta_2=0.98), "_velocities", "moving", 0.98),
])
def test_keras_optimizers_slots_are_recognised(optimizer, slots, kind, decay):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer, "mse")
    optimizer.build(model.trainable_variables)
    rules = optimizer_rules(optimizer, 1)
    found = [rules[id(v)] for v in getattr(optimizer, slots)]
    assert found and all(rule.kind == kind and rule.clock == 1 for rule in found)
    assert [rule.decay for rule in found] == pytest.approx([decay] * len(found))


def test_a_gans_optimizers_are_built_for_the_model_and_their_steps_are_counted_apart():
    model = TwoOptimizers()
    model.compile(optimizer="rmsprop")
    model(np.zeros((1, 3), "float32"))
    build_optimizers(model)
    state = ModelState(model)
    assert state.clocks == 4  # the model's steps, then model.optimizer, d_optimizer, g_optimizer
    assert sorted(state.counters.values()) == [1, 2, 3]
    g_moments = [state.rules[[id(f) for f in state.floats].index(id(v))] for v in model.g_optimizer._momentums]
    assert g_moments and all(rule.kind == "moving" and rule.clock == 3 for rule in g_moments)


def test_each_worker_draws_its_own_dropout_masks_and_the_first_the_scripts():
    from mpi_trainer.trainer.state import separate_random_streams

    def seeded() -> keras.Model:
        keras.utils.set_random_seed(0)  # as every rank's script seeds
        return keras.Sequential([keras.Input((64,)), keras.layers.Dropout(0.5), keras.layers.GaussianNoise(1.0)])

    ones = np.ones((4, 64), "float32")
    script, first, second = seeded(), seeded(), seeded()
    assert separate_random_streams(first, 0) == separate_random_streams(second, 1) == 2
    draws = [np.asarray(model(ones, training=True)) for model in (script, first, second)]
    np.testing.assert_array_equal(draws[1], draws[0])  # one worker draws what plain Keras draws
    assert not np.array_equal(draws[2], draws[0])  # another worker, other masks and noise
