"""A reference for full-batch L-BFGS tests: softmax regression in NumPy (float64), minimised by SciPy directly.

Nothing here uses mpi_trainer's L-BFGS code, so agreeing with it checks the
block sums, the gradients through Keras and the driver together.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import scipy.optimize

from mpi_trainer.config import DataConfig, ModelConfig
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model


def softmax_regression_objective(x: np.ndarray, y: np.ndarray, num_classes: int
                                 ) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """Mean cross-entropy and its gradient; params are the Dense kernel (features x classes), then the bias."""
    features = x.reshape(len(x), -1).astype(np.float64)
    rows = np.arange(len(y))

    def objective(params: np.ndarray) -> tuple[float, np.ndarray]:
        kernel = params[:-num_classes].reshape(features.shape[1], num_classes)
        logits = features @ kernel + params[-num_classes:]
        logits -= logits.max(axis=1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        residual = np.exp(log_probs)
        residual[rows, y] -= 1.0
        gradient = np.concatenate([(features.T @ residual).ravel(), residual.sum(axis=0)])
        return -log_probs[rows, y].sum() / len(y), gradient / len(y)

    return objective


def scipy_losses(objective: Callable, x0: np.ndarray, iterations: int) -> list[float]:
    """The mean loss after each iteration of ``scipy.optimize.minimize(method="L-BFGS-B")`` called directly."""
    losses: list[float] = []
    scipy.optimize.minimize(objective, x0, jac=True, method="L-BFGS-B",
                            callback=lambda intermediate_result: losses.append(float(intermediate_result.fun)),
                            options={"maxiter": iterations})
    return losses


def digits_softmax_problem(seed: int = 0, validation_size: float = 0.0) -> tuple[np.ndarray, np.ndarray, int, object]:
    """The training split of the digits, and softmax regression built as rank 0 builds it (same seed)."""
    dataset = load_dataset(DataConfig(source="digits", validation_size=validation_size), seed)
    keras.utils.set_random_seed(seed)
    model = build_model(ModelConfig(name="softmax_regression", optimizer="lbfgs"), dataset.input_shape,
                           dataset.num_outputs)
    return dataset.x_train, dataset.y_train, dataset.num_outputs, model
