"""Distributed L-BFGS does not depend on how the data is split (W = 1, 2, 3 blocks), and agrees with SciPy
called directly on the whole training set (NumPy objective, same model and starting point)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from lbfgs_reference import digits_softmax_problem, scipy_losses, softmax_regression_objective

from mpi_trainer.algorithms.lbfgs import LbfgsSettings, minimize
from mpi_trainer.config import ModelConfig
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.models import build_model
from mpi_trainer.models.gradients import BlockGradient

ITERATIONS = 8


def blockwise_losses(gradient: BlockGradient, x0: np.ndarray, x: np.ndarray, y: np.ndarray,
                     workers: int) -> list[float]:
    """The mean loss after each iteration when every block's sums are added, as the scheduler adds them."""
    bounds = block_bounds(len(x), workers)

    def evaluate(params: np.ndarray) -> tuple[float, np.ndarray]:
        parts = [gradient(params, x[start:end], y[start:end]) for start, end in bounds]
        return sum(p[0] for p in parts) / len(x), sum(p[1] for p in parts) / len(x)

    losses: list[float] = []
    minimize(evaluate, x0, LbfgsSettings(ITERATIONS), lambda it: losses.append(it.loss) and False)
    return losses


@pytest.fixture(scope="module")
def softmax_runs():
    x, y, classes, model = digits_softmax_problem()
    gradient = BlockGradient(model, batch_size=512)
    x0 = gradient.vector.read()  # evaluations move the model's variables: keep the start
    reference = scipy_losses(softmax_regression_objective(x, y, classes), x0, ITERATIONS)
    return reference, {workers: blockwise_losses(gradient, x0, x, y, workers) for workers in (1, 2, 3)}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_split_agrees_with_one_block(softmax_runs, workers):
    _, runs = softmax_runs
    assert len(runs[workers]) == ITERATIONS
    np.testing.assert_allclose(runs[workers], runs[1], rtol=1e-5)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_split_agrees_with_scipy_on_the_whole_dataset(softmax_runs, workers):
    reference, runs = softmax_runs
    assert len(reference) == ITERATIONS and reference[-1] < reference[0] / 5
    np.testing.assert_allclose(runs[workers], reference, rtol=1e-5)


def test_mlp_iterates_do_not_depend_on_the_split():
    x, y, classes, _ = digits_softmax_problem()
    keras.utils.set_random_seed(0)
    model, _ = build_model(ModelConfig(name="mlp", optimizer="lbfgs"), x.shape[1:], classes)
    gradient = BlockGradient(model, batch_size=512)
    x0 = gradient.vector.read()
    one, three = (blockwise_losses(gradient, x0, x, y, workers) for workers in (1, 3))
    assert one[-1] < one[0]
    np.testing.assert_allclose(three, one, rtol=1e-5)
