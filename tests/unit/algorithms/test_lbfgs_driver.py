"""The pure L-BFGS pieces: the SciPy driver's stop reasons and iterates, and the wire layout's sums."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mpi_trainer.algorithms.lbfgs import EVALUATE, STOP, LbfgsSettings, WireLayout, minimize

SCALES = np.array([1.0, 10.0, 100.0])
TARGET = np.array([1.0, -2.0, 3.0])


def quadratic(params: np.ndarray) -> tuple[float, np.ndarray]:
    """An ill-conditioned bowl with its minimum 0 at TARGET."""
    diff = params - TARGET
    return float(0.5 * np.sum(SCALES * diff**2)), SCALES * diff


def test_converges_to_the_minimum_and_reports_every_iterate():
    seen = []
    outcome = minimize(quadratic, np.zeros(3), LbfgsSettings(max_iterations=100),
                       lambda iterate: seen.append(iterate) and False)
    assert outcome.reason == "converged"
    np.testing.assert_allclose(outcome.params, TARGET, atol=1e-5)
    assert [it.iteration for it in seen] == list(range(outcome.iterations))
    assert seen[-1].loss == pytest.approx(outcome.loss)
    losses = [it.loss for it in seen]
    assert all(later <= earlier for earlier, later in zip(losses, losses[1:]))  # monotone line search
    evaluations = [it.evaluations for it in seen]
    assert evaluations == sorted(evaluations) and evaluations[-1] <= outcome.evaluations


def test_iteration_limit_is_reported_as_epochs():
    outcome = minimize(quadratic, np.zeros(3), LbfgsSettings(max_iterations=2))
    assert outcome.reason == "epochs" and outcome.iterations == 2


def test_evaluation_limit_is_reported_as_max_evaluations():
    outcome = minimize(quadratic, np.zeros(3), LbfgsSettings(max_iterations=100, max_evaluations=3))
    assert outcome.reason == "max_evaluations"
    assert outcome.iterations < 100


def test_on_iteration_returning_true_stops_at_that_iterate():
    outcome = minimize(quadratic, np.zeros(3), LbfgsSettings(max_iterations=100),
                       lambda iterate: iterate.iteration == 2, first_iteration=0)
    assert outcome.reason == "early_stopping" and outcome.iterations == 3


def test_a_continued_run_numbers_its_iterates_after_the_earlier_ones():
    seen = []
    minimize(quadratic, np.zeros(3), LbfgsSettings(max_iterations=2), lambda it: seen.append(it.iteration) and False,
             first_iteration=5)
    assert seen == [5, 6]


def test_a_nan_loss_stops_with_the_last_good_iterate():
    calls = {"n": 0}

    def breaks_after_four(params: np.ndarray) -> tuple[float, np.ndarray]:
        calls["n"] += 1
        loss, gradient = quadratic(params)
        return (math.nan, gradient) if calls["n"] > 4 else (loss, gradient)

    seen = []
    outcome = minimize(breaks_after_four, np.zeros(3), LbfgsSettings(max_iterations=100),
                       lambda it: seen.append(it) and False)
    assert outcome.reason == "nan" and "evaluation 5" in outcome.message
    np.testing.assert_array_equal(outcome.params, seen[-1].params)
    assert outcome.evaluations == 5


def test_wire_layout_sums_give_totals_and_every_workers_seconds():
    layout = WireLayout(num_params=4, workers=3)
    rng = np.random.default_rng(0)
    total = layout.contribution()  # the scheduler's zeros
    gradients, losses = [], []
    for rank, (samples, seconds) in enumerate([(5, 0.5), (7, 1.5), (6, 0.25)], start=1):
        part = layout.contribution()
        gradients.append(rng.normal(size=4))
        losses.append(float(rng.uniform(1, 2)))
        layout.gradient_slot(part)[:] = gradients[-1]
        layout.fill_header(part, rank, losses[-1], samples, seconds)
        total += part
    sums = layout.unpack(total)
    assert sums.samples == 18
    np.testing.assert_array_equal(sums.seconds, [0.5, 1.5, 0.25])
    loss, gradient = sums.mean()
    assert loss == pytest.approx(sum(losses) / 18)
    np.testing.assert_allclose(gradient, np.sum(gradients, axis=0) / 18)


def test_request_carries_the_flag_first():
    layout = WireLayout(num_params=2, workers=1)
    request = layout.request()
    layout.fill_request(request, np.array([3.0, 4.0]))
    assert request.tolist() == [EVALUATE, 3.0, 4.0]
    layout.fill_request(request, None)
    assert request[0] == STOP


def test_mean_of_an_empty_reduction_is_refused():
    layout = WireLayout(num_params=1, workers=1)
    with pytest.raises(ValueError, match="no samples"):
        layout.unpack(layout.contribution()).mean()
