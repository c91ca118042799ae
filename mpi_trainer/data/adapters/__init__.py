"""One adapter per kind of input, picked by :func:`get_input_adapter`.

=========================  =====================  ==========================================
input (``x``)              adapter                a worker's block
=========================  =====================  ==========================================
NumPy arrays               (row readers)          rows of a seeded shuffle (:mod:`..sources`)
arrays on disk, streamed   ``ArrayAdapter``       a contiguous range of rows, read in chunks
``tf.data.Dataset``        ``TFDatasetAdapter``   a contiguous range of its batches
``dataset_fn(context)``    ``TFDatasetAdapter``   the dataset the function builds for it
``keras.utils.PyDataset``  ``PyDatasetAdapter``   a contiguous range of batch indices
generator / iterator       ``GeneratorAdapter``   its own generator's batches (its own data)
=========================  =====================  ==========================================
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import numpy as np

from mpi_trainer.data.adapters.arrays import ArrayAdapter, LazyRows
from mpi_trainer.data.adapters.base import InputAdapter, check_steps
from mpi_trainer.data.adapters.generator import GeneratorAdapter, read_all
from mpi_trainer.data.adapters.py_dataset import PyDatasetAdapter
from mpi_trainer.data.adapters.tf_dataset import TFDatasetAdapter, is_tf_dataset
from mpi_trainer.errors import DataError

__all__ = ["ArrayAdapter", "GeneratorAdapter", "InputAdapter", "LazyRows", "PyDatasetAdapter",
           "TFDatasetAdapter", "get_input_adapter", "is_pipeline", "read_validation"]


def is_py_dataset(value: Any) -> bool:
    import keras

    return isinstance(value, keras.utils.PyDataset)


def is_dataset_fn(value: Any) -> bool:
    """A function of one argument (the input context) that is not a model, a class or a generator function."""
    if not callable(value) or inspect.isclass(value) or inspect.isgeneratorfunction(value):
        return False
    if hasattr(value, "get_weights") or hasattr(value, "__array__"):
        return False
    try:
        return len(inspect.signature(value).parameters) == 1
    except (TypeError, ValueError):
        return False


def is_pipeline(value: Any) -> bool:
    """Input that comes batched from a pipeline rather than as arrays."""
    if value is None or isinstance(value, (np.ndarray, list, tuple, dict)) or hasattr(value, "__array__"):
        return False
    return (is_tf_dataset(value) or is_py_dataset(value) or is_dataset_fn(value) or isinstance(value, Iterator)
            or inspect.isgeneratorfunction(value))


def _refuse_y(x: Any, y: Any, kind: str) -> None:
    if y is not None:
        raise DataError(f"When providing `x` as a {kind}, `y` should not be passed: the {kind} yields the labels "
                        f"with the features. Received: y of type {type(y).__name__}")


def get_input_adapter(x: Any, y: Any = None, steps_per_epoch: int | None = None) -> InputAdapter:
    """The adapter for a pipeline ``x`` (see :func:`is_pipeline`); refuses what its kind cannot take."""
    steps = check_steps(steps_per_epoch)
    if inspect.isgeneratorfunction(x):
        raise DataError(f"`x` is a generator function; pass the generator it returns. Received: x={x.__name__}, "
                        f"expected x={x.__name__}(...)")
    if is_tf_dataset(x):
        _refuse_y(x, y, "tf.data.Dataset")
        return TFDatasetAdapter(dataset=x, steps_per_epoch=steps)
    if is_py_dataset(x):
        _refuse_y(x, y, "keras.utils.PyDataset")
        if steps is not None:
            raise DataError("`steps_per_epoch` does not apply to a keras.utils.PyDataset, whose length is its "
                            f"batches. Received: steps_per_epoch={steps}")
        return PyDatasetAdapter(x)
    if is_dataset_fn(x):
        _refuse_y(x, y, "dataset_fn")
        return TFDatasetAdapter(dataset_fn=x, steps_per_epoch=steps)
    if isinstance(x, Iterator):
        _refuse_y(x, y, "generator")
        return GeneratorAdapter(x, steps)
    raise DataError(f"Unrecognized data type: x={type(x).__name__}; expected NumPy arrays, a tf.data.Dataset, "
                    f"a dataset_fn(context), a keras.utils.PyDataset or a generator of (x, y) batches")


def read_validation(data: Any) -> tuple[np.ndarray, np.ndarray]:
    """``validation_data`` of any kind, as arrays: ``(x, y)``, a dataset, a ``PyDataset`` or a generator."""
    if isinstance(data, (tuple, list)):
        if len(data) != 2:
            raise DataError(f"`validation_data` must be a pair (x, y) or a dataset. Received: {len(data)} items")
        return np.asarray(data[0]), np.asarray(data[1])
    if not is_pipeline(data) or is_dataset_fn(data):
        raise DataError(f"`validation_data` must be (x, y), a tf.data.Dataset, a keras.utils.PyDataset or a "
                        f"generator. Received: {type(data).__name__}")
    if isinstance(data, Iterator):
        return read_all(data, "validation_data")
    adapter = get_input_adapter(data)
    return adapter.read_split(0, adapter.length())


