"""Per-sample training weights from ``fit``'s ``class_weight`` and ``sample_weight``, as Keras applies them.

Keras multiplies a row's ``sample_weight`` by the ``class_weight`` of its label
(the arg-max of a one-hot label) and weights the training loss with the
product; the validation loss stays unweighted. Workers do the same for the
rows of their block, so a weighted data-parallel run optimises the objective
that plain ``model.fit`` would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mpi_trainer.errors import ConfigError


def check_class_weight(class_weight: Any, model: Any = None) -> dict[int, float] | None:
    """``class_weight`` as ``{class index: weight}``; Keras wants the keys 0..n-1, each weight a number >= 0,
    and (``model``: a ``keras.Model``; a function or a name is not known yet) a model with a single output."""
    if class_weight is None:
        return None
    outputs = getattr(model, "output_names", None)
    if outputs is not None and len(outputs) > 1:
        raise ConfigError(f"`class_weight` is only supported for models with a single output, as in Keras. "
                          f"Received: class_weight={class_weight!r} for a model with outputs {outputs}; expected "
                          f"class_weight=None (weight the rows with `sample_weight` instead)")
    if not isinstance(class_weight, Mapping) or not class_weight:
        raise ConfigError(f"`class_weight` must be a dict mapping class indices to weights. "
                          f"Received: class_weight={class_weight!r}")
    try:
        weights = {int(key): float(value) for key, value in class_weight.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"`class_weight` must map integer class indices to numbers. "
                          f"Received: class_weight={class_weight!r}") from None
    if sorted(weights) != list(range(len(weights))):
        raise ConfigError(f"`class_weight` must have the keys 0 to one less than the number of classes. "
                          f"Received: class_weight keys {sorted(weights)}")
    if any(not np.isfinite(w) or w < 0 for w in weights.values()):
        raise ConfigError(f"`class_weight` values must be finite numbers >= 0. Received: class_weight={weights}")
    return weights


def check_class_coverage(class_weight: dict[int, float] | None, num_classes: int, classes: bool) -> None:
    """Every class of the labels needs a weight, and the labels must be classes (indices or one-hot)."""
    if class_weight is None:
        return
    if classes and len(class_weight) < num_classes:
        raise ConfigError(f"`class_weight` gives {len(class_weight)} weights but the labels have {num_classes} "
                          f"classes. Received: class_weight keys {sorted(class_weight)}; expected 0..{num_classes - 1}")


def class_indices(y: np.ndarray) -> np.ndarray:
    """The class of each label: the index itself, or the arg-max of a one-hot / probability row."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] > 1:
        largest: np.ndarray = np.argmax(y, axis=1)
        return largest
    rounded: np.ndarray = np.rint(y.reshape(len(y))).astype(np.int64)
    return rounded


def training_weights(y: np.ndarray, class_weight: dict[int, float] | None,
                     sample_weight: np.ndarray | None) -> np.ndarray | None:
    """Each row's weight in the training loss (None: unweighted)."""
    if class_weight is None and sample_weight is None:
        return None
    weights = np.ones(len(y), dtype=np.float32) if sample_weight is None else np.asarray(sample_weight, np.float32)
    if class_weight is not None:
        table = np.array([class_weight[k] for k in range(len(class_weight))], dtype=np.float32)
        indices = class_indices(y)
        if len(indices) and (indices.min() < 0 or indices.max() >= len(table)):
            raise ConfigError(f"`class_weight` has no weight for class {int(indices.max())}. "
                              f"Received: class_weight keys {list(range(len(table)))}")
        weights = weights * table[indices]
    return weights
