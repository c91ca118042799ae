"""What kind an input is (:func:`input_kind`, the one place that tells), and one adapter per kind of input,
picked by :func:`get_input_adapter`.

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
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np

from mpi_trainer.data.adapters.arrays import ArrayAdapter, LazyRows
from mpi_trainer.data.adapters.base import DealtInput, InputAdapter, check_steps
from mpi_trainer.data.adapters.generator import GeneratorAdapter, read_all
from mpi_trainer.data.adapters.py_dataset import PyDatasetAdapter, PyDatasetShare
from mpi_trainer.data.adapters.tf_dataset import TFDatasetAdapter, is_tf_dataset
from mpi_trainer.errors import DataError

__all__ = ["ArrayAdapter", "DealtInput", "GeneratorAdapter", "InputAdapter", "LazyRows", "PyDatasetAdapter",
           "PyDatasetShare", "TFDatasetAdapter", "get_input_adapter", "input_kind", "is_pipeline", "pipeline_share",
           "read_validation"]


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


def input_kind(x: Any) -> str:
    """What kind of input ``x`` is, as Keras' ``fit`` tells them apart: "arrays" (NumPy, tensors, pandas, any
    nesting of them, and None), "tf.data.Dataset", "PyDataset", "generator" (a generator or any iterator),
    "dataset_fn" (a function of the input context), "generator function" (which ``fit`` cannot take: the
    generator it returns is meant), or a :class:`DealtInput`'s own kind."""
    if x is None or isinstance(x, (np.ndarray, list, tuple, dict)) or hasattr(x, "__array__"):
        return "arrays"
    if isinstance(x, DealtInput):
        return x.kind
    if is_tf_dataset(x):
        return "tf.data.Dataset"
    if is_py_dataset(x):
        return "PyDataset"
    if inspect.isgenerator(x) or isinstance(x, Iterator):
        return "generator"
    if inspect.isgeneratorfunction(x):
        return "generator function"
    if is_dataset_fn(x):
        return "dataset_fn"
    return "arrays"


def is_pipeline(value: Any) -> bool:
    """Input that comes batched from a pipeline rather than as arrays."""
    return input_kind(value) != "arrays"


def pipeline_share(x: Any, workers: int, index: int) -> Any:
    """Worker ``index``'s (0-based) share of a pipeline, of the same kind, cut without changing a batch: a
    :class:`DealtInput`'s own, every ``workers``-th batch of a ``tf.data.Dataset`` (``shard``) or a
    ``PyDataset`` (:class:`PyDatasetShare`), every ``workers``-th item a generator yields. (Arrays are cut
    by rows: :mod:`mpi_trainer.trainer.shares`.)"""
    kind = input_kind(x)
    if isinstance(x, DealtInput):
        return x.share(workers, index)
    if kind == "tf.data.Dataset":
        return x.shard(workers, index)
    if kind == "PyDataset":
        return PyDatasetShare(x, workers, index)
    if kind == "generator":
        return (item for item in itertools.islice(x, index, None, workers))  # a generator, as Keras takes one
    raise DataError(f"A share of fit's input is cut from arrays or a pipeline. Received: x of kind {kind!r}; "
                    f"expected arrays, a tf.data.Dataset, a keras.utils.PyDataset or a generator")


def _refuse_y(x: Any, y: Any, kind: str) -> None:
    if y is not None:
        raise DataError(f"When providing `x` as a {kind}, `y` should not be passed: the {kind} yields the labels "
                        f"with the features. Received: y of type {type(y).__name__}")


def get_input_adapter(x: Any, y: Any = None, steps_per_epoch: int | None = None) -> InputAdapter:
    """The adapter for a pipeline ``x`` (see :func:`is_pipeline`); refuses what its kind cannot take."""
    steps, kind = check_steps(steps_per_epoch), input_kind(x)
    if kind == "generator function":
        raise DataError(f"`x` is a generator function; pass the generator it returns. Received: x={x.__name__}, "
                        f"expected x={x.__name__}(...)")
    if kind == "tf.data.Dataset":
        _refuse_y(x, y, "tf.data.Dataset")
        return TFDatasetAdapter(dataset=x, steps_per_epoch=steps)
    if kind == "PyDataset":
        _refuse_y(x, y, "keras.utils.PyDataset")
        if steps is not None:
            raise DataError("`steps_per_epoch` does not apply to a keras.utils.PyDataset, whose length is its "
                            f"batches. Received: steps_per_epoch={steps}")
        return PyDatasetAdapter(x)
    if kind == "dataset_fn":
        _refuse_y(x, y, "dataset_fn")
        return TFDatasetAdapter(dataset_fn=x, steps_per_epoch=steps)
    if kind == "generator":
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


