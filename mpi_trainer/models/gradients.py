"""Loss sum and gradient sum of a Keras model over arrays, through the backend's own autodiff.

Full-batch L-BFGS needs, on each worker, ``sum_i loss_i(w)`` and its gradient
with respect to the model's trainable variables over the worker's whole block.
:class:`BlockGradient` computes both in batches of ``batch_size`` rows, so
memory stays bounded, and accumulates them in float64. The model runs with
``training=False``: dropout is off and batch normalisation uses its stored
statistics, so the objective is one deterministic function of the weights,
which L-BFGS's line search requires. Regularisation losses (``model.losses``)
count once per sample, so that dividing the sum by N adds them exactly once.

Per backend: TensorFlow with ``tf.GradientTape`` in a ``tf.function``; JAX
with ``model.stateless_call`` under ``jax.value_and_grad`` and ``jax.jit``;
PyTorch with autograd. Other backends have no gradients and are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from mpi_trainer.errors import ConfigError

SUPPORTED_BACKENDS = ("tensorflow", "jax", "torch")


def gradient_backend() -> str:
    """The Keras backend's name, if it can differentiate; a ConfigError otherwise."""
    import keras

    backend: str = keras.backend.backend()
    if backend not in SUPPORTED_BACKENDS:
        raise ConfigError(f"model.optimizer='lbfgs' needs gradients, which the {backend!r} Keras backend cannot "
                          f"compute. Received: KERAS_BACKEND={backend!r}; expected one of {list(SUPPORTED_BACKENDS)}")
    return backend


def per_sample_loss(model: Any) -> Callable[[Any, Any], Any]:
    """The compiled loss as a function returning one value per sample (no reduction)."""
    import keras

    from mpi_trainer.models import losses

    loss = losses.loss_by_name(model.loss)  # our one-hot losses by name
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    elif isinstance(loss, dict) and "class_name" in loss:
        loss = keras.losses.deserialize(loss)
    unreduced: Callable[[Any, Any], Any]
    if isinstance(loss, keras.losses.Loss):
        unreduced = loss.call  # a Loss object's call() is its unreduced part
    elif callable(loss):
        unreduced = loss
    else:
        raise ConfigError("model.optimizer='lbfgs' needs a model compiled with one loss function. "
                          f"Received: loss={model.loss!r}")
    return unreduced


def _regularisation(ops: Any, terms: list[Any]) -> Any:
    return ops.sum(ops.stack([ops.cast(term, "float32") for term in terms])) if terms else 0.0


def check_trainable(model: Any, variables: list[Any]) -> list[Any]:
    """``variables``, the model's trainable variables that L-BFGS moves; a ConfigError where there are none."""
    if not variables:
        raise ConfigError(f"model.optimizer='lbfgs' needs trainable weights; model {model.name!r} has none")
    return variables


class _TensorFlowStep:
    def __init__(self, model: Any, loss_fn: Callable, variables: list[Any]) -> None:
        import tensorflow as tf
        from keras import ops

        @tf.function(reduce_retracing=True)
        def step(x: Any, y: Any) -> tuple[Any, list[Any]]:
            with tf.GradientTape() as tape:
                predictions = model(x, training=False)
                total = tf.reduce_sum(loss_fn(y, predictions))
                total += tf.cast(tf.shape(x)[0], total.dtype) * _regularisation(ops, model.losses)
            return total, tape.gradient(total, variables)

        self.step = step

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[Any]]:
        import tensorflow as tf

        total, grads = self.step(tf.convert_to_tensor(x), tf.convert_to_tensor(y))
        return float(total), [None if g is None else g.numpy() for g in grads]


class _JaxStep:
    def __init__(self, model: Any, loss_fn: Callable, variables: list[Any]) -> None:
        import jax
        import jax.numpy as jnp
        from keras import ops

        self.variables = variables
        non_trainable = [v.value for v in model.non_trainable_variables]

        def objective(trainable: list[Any], x: Any, y: Any) -> Any:
            predictions, _, extra = model.stateless_call(trainable, non_trainable, x, training=False,
                                                         return_losses=True)
            return jnp.sum(loss_fn(y, predictions)) + x.shape[0] * _regularisation(ops, extra)

        self.step = jax.jit(jax.value_and_grad(objective))

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[Any]]:
        total, grads = self.step([v.value for v in self.variables], x, y)
        return float(total), [np.asarray(g) for g in grads]


class _TorchStep:
    def __init__(self, model: Any, loss_fn: Callable, variables: list[Any]) -> None:
        from keras import ops

        self.model, self.loss_fn, self.variables, self.ops = model, loss_fn, variables, ops

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[Any]]:
        import torch

        parameters = [v.value for v in self.variables]  # torch Parameters with requires_grad
        with torch.enable_grad():
            predictions = self.model(self.ops.convert_to_tensor(x), training=False)
            total = torch.sum(self.loss_fn(self.ops.convert_to_tensor(y), predictions))
            total = total + len(x) * _regularisation(self.ops, self.model.losses)
            grads = torch.autograd.grad(total, parameters, allow_unused=True)
        return float(total.detach().cpu()), [None if g is None else g.detach().cpu().numpy() for g in grads]


class _Step(Protocol):
    """One backend's loss-and-gradient step on a batch, at the variables' values."""

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[float, list[Any]]: ...


_STEPS: dict[str, Callable[[Any, Callable, list[Any]], _Step]] = {
    "tensorflow": _TensorFlowStep, "jax": _JaxStep, "torch": _TorchStep}


class BlockGradient:
    """``(x, y) -> (loss sum, gradient sum)`` for one model at its variables' values, in batches of
    ``batch_size`` rows: the gradient with respect to ``variables`` (the model's trainable ones, in the order
    the caller's state keeps them), one flat float64 vector in that order."""

    def __init__(self, model: Any, variables: list[Any], batch_size: int = 4096) -> None:
        self.variables = check_trainable(model, variables)
        self.shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.offsets = np.concatenate([[0], np.cumsum([int(np.prod(shape)) for shape in self.shapes])])
        self.size = int(self.offsets[-1])
        self.batch_size = batch_size
        self.step = _STEPS[gradient_backend()](model, per_sample_loss(model), self.variables)

    def __call__(self, x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> tuple[float, np.ndarray]:
        """Loss sum and gradient sum over ``(x, y)``; the gradient goes into ``out`` if given."""
        out = np.zeros(self.size, dtype=np.float64) if out is None else out
        out[:] = 0.0
        parts = [out[start:stop].reshape(shape)
                 for shape, start, stop in zip(self.shapes, self.offsets[:-1], self.offsets[1:])]
        total = 0.0
        for start in range(0, len(x), self.batch_size):
            loss, grads = self.step(x[start:start + self.batch_size], y[start:start + self.batch_size])
            total += loss
            for part, grad in zip(parts, grads):
                if grad is not None:  # a variable the loss does not depend on keeps a zero gradient
                    part += grad
        return total, out
