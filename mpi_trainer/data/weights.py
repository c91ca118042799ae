"""``fit``'s ``class_weight``, checked as Keras checks it, before training and on every rank.

Workers hand ``class_weight`` to Keras as ``model.fit`` would have it: for rows held in memory Keras'
own mapping of each label to its class's weight becomes the rows' sample weights (a class without a
weight weighs 1, as for arrays given to Keras' ``fit``); a ``tf.data.Dataset`` or a
``keras.utils.PyDataset`` gets it as ``fit``'s argument. What Keras refuses (``class_weight`` with
``sample_weight``, with a generator, or with targets per output) is refused here, before training,
with Keras' own message.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from mpi_trainer.errors import ConfigError


def check_class_weight(class_weight: Any, model: Any = None) -> dict[int, float] | None:
    """``class_weight`` as ``{class index: weight}``: a dict of integer keys and numbers, and (``model``: a
    ``keras.Model``; a function or a name is not known yet) a model with a single output, as Keras wants."""
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
        return {int(key): float(value) for key, value in class_weight.items()}
    except (TypeError, ValueError):
        raise ConfigError(f"`class_weight` must map integer class indices to numbers. "
                          f"Received: class_weight={class_weight!r}") from None


def keras_refusal(x: Any, y: Any, sample_weight: Any, class_weight: dict[int, float] | None) -> str | None:
    """Keras' own refusal of ``class_weight`` with these inputs, as its ``fit`` raises it, or None.

    Keras' data adapters decide: arrays are looked at through their first rows, a dataset or a
    ``PyDataset`` as given (nothing is read), a generator by its kind alone (its batches are not touched).
    A ``dataset_fn`` is only built on the workers, so Keras checks it there.
    """
    if class_weight is None or x is None:
        return None
    from keras.src.trainers.data_adapters import get_data_adapter

    from mpi_trainer.data.adapters import is_dataset_fn, is_pipeline

    if is_dataset_fn(x):
        return None
    if isinstance(x, Iterator):
        x = _no_batches()  # Keras refuses class_weight with any generator before reading it
    elif not is_pipeline(x):
        try:
            x, y, sample_weight = (None if part is None else _first_rows(part) for part in (x, y, sample_weight))
        except (TypeError, ValueError, IndexError):
            return None  # not arrays Keras' adapter takes as they are: the workers' fit meets them as arrays
    try:
        get_data_adapter(x, y, sample_weight, batch_size=2, class_weight=class_weight)
    except ValueError as exc:
        return str(exc)
    return None


def _first_rows(arrays: Any) -> Any:
    import keras

    return keras.tree.map_structure(lambda array: np.asarray(array)[:2], arrays)


def _no_batches() -> Iterator[Any]:
    yield from ()
