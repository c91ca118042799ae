"""The NaN check over a model-sized vector: a non-finite value anywhere is found, and finite values whose sum
overflows float32 are not taken for one."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.algorithms.passes import CHUNK, all_finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("at", [0, CHUNK - 1, 5 * CHUNK + 17])
def test_a_single_non_finite_value_anywhere_is_found(bad, at):
    vector = np.ones(6 * CHUNK, np.float32)
    vector[at] = bad
    assert not all_finite(vector, threads=2)


def test_finite_values_whose_sum_overflows_are_finite():
    vector = np.full(3 * CHUNK, np.finfo(np.float32).max, np.float32)
    vector[CHUNK:2 * CHUNK] *= -1  # a chunk whose sum overflows to -inf
    assert np.isinf(np.add.reduce(vector[:CHUNK]))
    assert all_finite(vector, threads=2)
    vector[2 * CHUNK + 3] = np.inf
    assert not all_finite(vector, threads=2)
