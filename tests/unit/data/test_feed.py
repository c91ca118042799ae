"""What a worker's model.fit reads: one shuffled epoch of its rows, without tf.data autotuning."""

from __future__ import annotations

import numpy as np

from mpi_trainer.data.feed import fit_arguments


def epoch(arguments: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.numpy(), y.numpy()) for x, y in arguments["x"]]


def test_one_epoch_covers_every_row_once_in_batches_with_the_last_partial():
    x = np.arange(70, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    y = np.arange(70) % 4
    arguments = fit_arguments(x, y, 32, np.random.default_rng(0))
    batches = epoch(arguments)
    assert [len(bx) for bx, _ in batches] == [32, 32, 6]
    rows = np.concatenate([bx[:, 0] for bx, _ in batches]).astype(int)
    assert sorted(rows) == list(range(70)) and list(rows) != list(range(70))  # all rows, shuffled
    for bx, by in batches:  # features and labels stay paired
        np.testing.assert_array_equal(bx[:, 0].astype(int) % 4, by)
    assert arguments["shuffle"] is False  # fit must not shuffle again
    assert arguments["x"].options().autotune.enabled is False


def test_each_round_gets_a_new_order_and_the_same_seed_the_same_orders():
    x, y = np.arange(50, dtype=np.float32)[:, None], np.zeros(50, np.int64)
    rng = np.random.default_rng(7)
    first, second = (np.concatenate([bx[:, 0] for bx, _ in epoch(fit_arguments(x, y, 8, rng))]) for _ in range(2))
    assert not np.array_equal(first, second)
    again = np.concatenate([bx[:, 0] for bx, _ in epoch(fit_arguments(x, y, 8, np.random.default_rng(7)))])
    np.testing.assert_array_equal(first, again)


def test_off_tensorflow_the_same_seeded_order_comes_as_a_keras_py_dataset():
    import keras

    x = np.arange(70, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32)
    y = np.arange(70) % 4
    native = fit_arguments(x, y, 32, np.random.default_rng(3), backend="jax")
    assert isinstance(native["x"], keras.utils.PyDataset) and native["shuffle"] is False
    batches = [native["x"][i] for i in range(len(native["x"]))]
    assert [len(bx) for bx, _ in batches] == [32, 32, 6]
    for bx, by in batches:
        np.testing.assert_array_equal(bx[:, 0].astype(int) % 4, by)
    # The order a worker draws does not depend on the backend it trains on.
    on_tf = epoch(fit_arguments(x, y, 32, np.random.default_rng(3), backend="tensorflow"))
    np.testing.assert_array_equal(np.concatenate([bx for bx, _ in batches]), np.concatenate([bx for bx, _ in on_tf]))
