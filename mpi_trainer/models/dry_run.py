"""One training step and one evaluation on a handful of real samples, before round 0.

A mismatch between the model's output, the labels and the loss (integer labels
on a one-hot loss, one output for ten classes, a regression target on a
classifier) would otherwise fail on the workers part-way through the first
round. The scheduler runs this on the first rows of the training split and
every worker on the first batch of its own block, and the job agrees on the
result, so the mismatch fails on every rank before anything trains, with one
message naming the output shape, the labels' shape and dtype, and the loss.
The model's weights and optimizer state are left as they were.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_trainer.errors import InputError

SAMPLES = 8  # rows the scheduler tries (a worker uses its first batch)


class ModelDataMismatch(InputError):
    """The model, its loss and the labels cannot train together."""


def describe_loss(model: Any) -> str:
    loss = getattr(model, "loss", None)
    return loss if isinstance(loss, str) else getattr(loss, "__name__", None) or type(loss).__name__


def mismatch(model: Any, y: np.ndarray, exc: Exception) -> ModelDataMismatch:
    outputs = [tuple(output.shape) for output in model.outputs]
    shown = outputs[0] if len(outputs) == 1 else outputs
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ModelDataMismatch(
        f"The model's output, the labels and the loss do not fit together: model output shape {shown}, "
        f"labels of shape {tuple(y.shape[1:])} per sample and dtype {y.dtype}, loss {describe_loss(model)!r} "
        f"({type(exc).__name__}: {first_line[:300]}). Integer labels are class indices; one-hot, "
        f"multi-label and regression targets must be floats; set `model.loss` to match the labels")


def is_mismatch(exc: Exception) -> bool:
    """Shape and dtype errors: Keras and JAX raise ValueError or TypeError, TensorFlow's kernels
    InvalidArgumentError (PyTorch's RuntimeError cannot be told apart from a crash, so it stays one)."""
    return isinstance(exc, (ValueError, TypeError)) or type(exc).__name__ == "InvalidArgumentError"


def dry_run(model: Any, x: np.ndarray, y: np.ndarray, train: bool = True) -> list[str]:
    """Train one step on ``(x, y)`` (one batch) and evaluate on it, then restore the model.

    ``train=False`` only evaluates: the loss still meets the model's output and the labels, and the
    optimizer's state (twice the model under Adam) is never built. The scheduler, which never
    trains, runs it so; the workers train the step. Returns the names of the compiled metrics as
    evaluation reports them (``loss`` first).
    """
    weights = model.get_weights() if train else None
    try:
        if train and getattr(model, "optimizer", None) is not None:
            model.train_on_batch(x, y)
        result = model.test_on_batch(x, y, return_dict=True)
    except Exception as exc:
        if not is_mismatch(exc):
            raise  # a bug in user code is a crash, with its traceback, not bad input
        raise mismatch(model, y, exc) from None
    finally:
        if weights is not None:
            model.set_weights(weights)
            reset_optimizer(getattr(model, "optimizer", None))
    return ["loss", *sorted(name for name in result if name != "loss")]


def reset_optimizer(optimizer: Any) -> None:
    """Zero an optimizer's moments and step count (its learning rate stays)."""
    if optimizer is None:
        return
    for variable in optimizer.variables:
        if "learning_rate" not in variable.path:
            variable.assign(np.zeros(variable.shape, dtype=variable.dtype))
