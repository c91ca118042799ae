"""Pure pieces driven with plain numbers: aggregation, partitioning, early stopping, codec, threads."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.algorithms.aggregation import combine, contribution_scale, elect
from mpi_trainer.algorithms.early_stopping import EarlyStopping
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.launch.runtime import threads_for_rank


def test_average_is_the_plain_mean():
    vectors = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)]
    np.testing.assert_allclose(combine(vectors, [10, 30], "average"), [2.0, 4.0])


def test_weighted_average_uses_sample_counts():
    vectors = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32)]
    # (10 * [1, 2] + 30 * [3, 6]) / 40 = [2.5, 5.0]
    np.testing.assert_allclose(combine(vectors, [10, 30], "weighted"), [2.5, 5.0])


@pytest.mark.parametrize("method, scales, expected", [
    ("average", [1 / 3, 1 / 3, 1 / 3], [3.0, 6.0]),  # ([1, 2] + [3, 6] + [5, 10]) / 3
    ("weighted", [1 / 4, 1 / 4, 2 / 4], [3.5, 7.0]),  # (1 * [1, 2] + 1 * [3, 6] + 2 * [5, 10]) / 4
])
def test_scaled_contributions_sum_to_the_mean_worked_out_by_hand(method, scales, expected):
    """The reduction path: each worker scales its own weights, MPI only sums them."""
    vectors = [np.array([1.0, 2.0], np.float32), np.array([3.0, 6.0], np.float32), np.array([5.0, 10.0], np.float32)]
    samples = [1, 1, 2]
    got = [contribution_scale(method, n, sum(samples), len(vectors)) for n in samples]
    np.testing.assert_allclose(got, scales)
    summed = sum(np.float32(scale) * v for scale, v in zip(got, vectors))
    np.testing.assert_allclose(summed, expected, rtol=1e-6)
    np.testing.assert_allclose(combine(vectors, samples, method), expected, rtol=1e-6)


def test_contribution_scale_rejects_unknown_method():
    with pytest.raises(ValueError, match="Received: method='best'"):
        contribution_scale("best", 1, 2, 2)


def test_election_prefers_accuracy_then_loss_then_lower_rank():
    assert elect({1: (0.90, 0.3), 2: (0.95, 0.5), 3: (0.93, 0.1)}) == 2
    assert elect({1: (0.95, 0.4), 2: (0.95, 0.2)}) == 2
    assert elect({3: (0.95, 0.2), 2: (0.95, 0.2)}) == 2
    with pytest.raises(ValueError):
        elect({})


@pytest.mark.parametrize("n, workers", [(10, 3), (9, 3), (1000, 7), (5, 5)])
def test_blocks_are_contiguous_cover_everything_and_differ_by_at_most_one(n, workers):
    bounds = block_bounds(n, workers)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1 and len(bounds) == workers


def test_fewer_samples_than_workers_is_an_error():
    with pytest.raises(ValueError, match="2 samples for 3 workers"):
        block_bounds(2, 3)


def test_early_stopping_counts_patience_and_says_which_round_became_the_best():
    stopper = EarlyStopping("test_accuracy", patience=2, min_delta=0.01)
    assert not stopper.update(0, 0.80) and stopper.just_improved
    assert not stopper.update(1, 0.85) and stopper.just_improved
    assert not stopper.update(2, 0.855) and not stopper.just_improved  # below min_delta: no improvement
    assert stopper.update(3, 0.84) and not stopper.just_improved
    assert stopper.best_round == 1 and stopper.best_value == 0.85


def test_early_stopping_minimises_losses_and_zero_patience_never_stops():
    stopper = EarlyStopping("val_loss", patience=0)
    for round_index, loss in enumerate([1.0, 0.5, 0.9, 0.9, 0.9]):
        assert not stopper.update(round_index, loss)
    assert stopper.best_round == 1


@pytest.mark.parametrize(
    "rank, cores, node_ranks, usable, expected",
    [
        (1, 2, [0, 1], None, 2),  # one worker beside the scheduler gets the node
        (1, 2, [0, 1, 2], None, 1),  # two workers share two cores
        (2, 16, [0, 1, 2, 3, 4], None, 4),
        (0, 16, [0, 1, 2, 3, 4], None, 16),  # the scheduler is not counted and may use the node
        (3, 16, [2, 3], None, 8),
        (1, 3, [0, 1, 2, 3, 4], None, 1),  # never fewer than one thread
        (1, 16, [0, 1], 1, 1),  # bound to one core by mpirun
    ],
)
def test_threads_per_worker(rank, cores, node_ranks, usable, expected):
    assert threads_for_rank(rank, cores, node_ranks, usable) == expected


def test_train_threads_fixes_a_workers_threads_but_not_the_schedulers():
    assert threads_for_rank(1, 16, [0, 1, 2], None, configured=3) == 3
    assert threads_for_rank(0, 16, [0, 1, 2], None, configured=3) == 16
