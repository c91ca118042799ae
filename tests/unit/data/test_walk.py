"""BlockWalk: the batches of k-step rounds walk one permutation at a time, across rounds."""

from __future__ import annotations

import numpy as np

from mpi_trainer.data.walk import BlockWalk


def test_every_row_is_used_once_before_any_repeats_and_the_epochs_last_batch_is_partial():
    walk = BlockWalk(np.random.default_rng(3))
    batches = [walk.next_rows(10, 4) for _ in range(6)]
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2]
    first, second = np.concatenate(batches[:3]), np.concatenate(batches[3:])
    assert sorted(first) == list(range(10)) == sorted(second)
    assert not np.array_equal(first, second)  # reshuffled when it wrapped


def test_the_walk_follows_the_generator_so_a_seed_repeats_it():
    a, b = BlockWalk(np.random.default_rng(7)), BlockWalk(np.random.default_rng(7))
    for _ in range(5):
        np.testing.assert_array_equal(a.next_rows(9, 4), b.next_rows(9, 4))


def test_a_changed_block_size_starts_a_new_epoch():
    walk = BlockWalk(np.random.default_rng(0))
    walk.next_rows(10, 4)
    rows = np.concatenate([walk.next_rows(6, 4), walk.next_rows(6, 4)])
    assert sorted(rows) == list(range(6))
