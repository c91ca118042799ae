"""Loss and gradient sums through the backend's autodiff, checked against NumPy and finite differences."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from lbfgs_reference import digits_softmax_problem, softmax_regression_objective

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError
from mpi_trainer.models import build_model, evaluate_model
from mpi_trainer.models.gradients import BlockGradient, gradient_backend
from mpi_trainer.trainer.state import ModelState

TESTS = Path(__file__).resolve().parents[2]


def block_gradient(model, batch_size=4096):
    """(the model's trainable values, ``(params, x, y) -> (loss sum, gradient sum)``): the sums at ``params``
    written into the model through its :class:`ModelState`, as an L-BFGS worker writes what rank 0 asks for."""
    state = ModelState(model)
    gradient = BlockGradient(model, state.trainable, batch_size)

    def at(params, x, y):
        state.write_trainable(params)
        return gradient(x, y)

    return state.read_trainable(), at


@pytest.fixture(scope="module")
def digits():
    x, y, classes, model = digits_softmax_problem()
    return x[:600], y[:600], classes, model


def test_softmax_regression_sums_match_numpy(digits):
    x, y, classes, model = digits
    initial, gradient = block_gradient(model)
    params = initial + np.random.default_rng(1).normal(0, 0.1, initial.size)
    loss_sum, grad_sum = gradient(params, x, y)
    loss, grad = softmax_regression_objective(x, y, classes)(params)
    assert loss_sum == pytest.approx(loss * len(x), rel=1e-6)
    np.testing.assert_allclose(grad_sum, grad * len(x), rtol=1e-4, atol=1e-4 * np.abs(grad * len(x)).max())


def test_batching_and_splitting_do_not_change_the_sums(digits):
    x, y, _, model = digits
    params, whole = block_gradient(model)
    _, batched = block_gradient(model, batch_size=64)
    loss, grad = whole(params, x, y)
    parts = [batched(params, x[s:e], y[s:e]) for s, e in [(0, 250), (250, 600)]]
    assert sum(p[0] for p in parts) == pytest.approx(loss, rel=1e-6)
    np.testing.assert_allclose(sum(p[1] for p in parts), grad, rtol=1e-5, atol=1e-5 * np.abs(grad).max())


def test_a_deep_smooth_model_matches_a_finite_difference(digits):
    """tanh hidden layers: smooth, so a central difference converges to the directional derivative."""
    x, y, classes, _ = digits
    x, y = x[:100], y[:100]  # a small sum, so float32 rounding stays far below the difference measured
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(classes, activation="softmax")])
    model.compile(loss="sparse_categorical_crossentropy")
    params, gradient = block_gradient(model)
    direction = np.random.default_rng(2).normal(size=params.size)
    direction /= np.linalg.norm(direction)
    step = 0.02
    plus, _ = gradient(params + step * direction, x, y)
    minus, _ = gradient(params - step * direction, x, y)
    _, grad = gradient(params, x, y)
    assert float(grad @ direction) == pytest.approx((plus - minus) / (2 * step), rel=1e-2)


def test_dropout_is_off_so_the_objective_is_deterministic_and_equals_evaluate(digits):
    x, y, classes, _ = digits
    keras.utils.set_random_seed(0)
    model = build_model(ModelConfig(name="lenet", optimizer="lbfgs"), x.shape[1:], classes)
    params, gradient = block_gradient(model, batch_size=128)
    first, second = gradient(params, x[:200], y[:200]), gradient(params, x[:200], y[:200])
    assert first[0] == second[0]
    np.testing.assert_array_equal(first[1], second[1])
    assert first[0] / 200 == pytest.approx(evaluate_model(model, x[:200], y[:200], 200)["loss"], rel=1e-5)


@pytest.mark.parametrize("loss, activation", [("squared_error", "softmax"), ("cross_entropy", "sigmoid")])
def test_the_configured_loss_is_the_one_differentiated(digits, loss, activation):
    x, y, classes, _ = digits
    keras.utils.set_random_seed(0)
    cfg = ModelConfig(name="softmax_regression", optimizer="lbfgs", loss=loss, activation=activation)
    model = build_model(cfg, x.shape[1:], classes)
    params, gradient = block_gradient(model)
    loss_sum, _ = gradient(params, x, y)
    assert loss_sum / len(x) == pytest.approx(evaluate_model(model, x, y, 256)["loss"], rel=1e-5)


def test_regularisation_counts_once_in_the_mean(digits):
    x, y, classes, _ = digits
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(x.shape[1:]), keras.layers.Flatten(),
                              keras.layers.Dense(classes, activation="softmax",
                                                 kernel_regularizer=keras.regularizers.L2(0.5))])
    model.compile(loss="sparse_categorical_crossentropy")
    params, gradient = block_gradient(model)
    loss_sum, grad_sum = gradient(params, x, y)
    unregularised, grad = softmax_regression_objective(x, y, classes)(params)
    kernel = params[:-classes]
    assert loss_sum / len(x) == pytest.approx(unregularised + 0.5 * np.sum(kernel**2), rel=1e-5)
    expected = grad + np.concatenate([kernel, np.zeros(classes)])
    np.testing.assert_allclose(grad_sum / len(x), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_a_backend_without_gradients_is_refused(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "numpy")
    with pytest.raises(ConfigError, match=r"Received: KERAS_BACKEND='numpy'; expected one of"):
        gradient_backend()


JAX_CHECK = textwrap.dedent("""
    import numpy as np
    from lbfgs_reference import digits_softmax_problem, scipy_losses, softmax_regression_objective
    from mpi_trainer.algorithms.lbfgs import LbfgsSettings, minimize
    from mpi_trainer.models.gradients import BlockGradient
    from mpi_trainer.trainer.state import ModelState

    x, y, classes, model = digits_softmax_problem()
    state = ModelState(model)
    block = BlockGradient(model, state.trainable, batch_size=500)
    def gradient(params, x, y):
        state.write_trainable(params)
        return block(x, y)
    x0 = state.read_trainable()
    loss_sum, grad_sum = gradient(x0, x, y)
    loss, grad = softmax_regression_objective(x, y, classes)(x0)
    assert abs(loss_sum / len(x) / loss - 1) < 1e-6, (loss_sum, loss)
    assert np.abs(grad_sum / len(x) - grad).max() < 1e-5 * np.abs(grad).max()
    seen = []
    minimize(lambda p: tuple(v / len(x) for v in gradient(p, x, y)), x0, LbfgsSettings(5),
             lambda it: seen.append(it.loss) and False)
    reference = scipy_losses(softmax_regression_objective(x, y, classes), x0, 5)
    np.testing.assert_allclose(seen, reference, rtol=1e-5)
    print("jax ok")
""")


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="JAX is not installed (the `jax` extra)")
def test_jax_backend_gives_the_same_sums_and_iterates():
    env = {**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join(
        [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", JAX_CHECK], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "jax ok" in proc.stdout, proc.stdout + proc.stderr
