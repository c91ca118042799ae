"""A ``tf.data.Dataset`` (or a ``dataset_fn(context)`` that builds one per worker) as a source read as a
pipeline: its length in batches, its first batch (the model's dry run and element spec come from it), and
the evaluation splits held out at its end.

Every rank builds the same pipeline, as in a Horovod script; worker *i* of *W* trains on
``dataset.shard(W, i)``, every *W*-th batch, so the pipeline stays exactly as written (its batch size,
padding and per-batch maps; :mod:`mpi_trainer.trainer.shares`). A pipeline that reads many files is better
given as ``dataset_fn(context)``, which receives a ``tf.distribute.InputContext`` (``input_pipeline_id`` =
the worker index, ``num_input_pipelines`` = the worker count) and builds that worker's own shard, typically
by sharding its list of files before reading them. A pipeline that shuffles should pass a ``seed`` so that
every rank draws the same order and the shares do not overlap. An infinite dataset (``repeat()``) needs
``steps_per_epoch``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_trainer.data.adapters.base import InputAdapter, as_pair, concatenate
from mpi_trainer.errors import DataError

KIND = "tf.data.Dataset"


def is_tf_dataset(value: Any) -> bool:
    """A ``tf.data.Dataset``, recognised without importing TensorFlow."""
    return any(cls.__module__.startswith("tensorflow.python.data") and cls.__name__ in ("DatasetV2", "DatasetV1")
               for cls in type(value).__mro__)


def require_tensorflow_backend(kind: str = KIND) -> None:
    """A ``kind`` read through tf.data needs the TensorFlow backend; any other fails before training."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise DataError(f"A {kind} is read on the TensorFlow backend only. Received: KERAS_BACKEND={backend!r}; "
                        f"expected 'tensorflow', or pass the data as a keras.utils.PyDataset or arrays, which "
                        f"every backend reads")


def input_context(worker: int, workers: int) -> Any:
    import tensorflow as tf

    return tf.distribute.InputContext(num_input_pipelines=workers, input_pipeline_id=worker,
                                      num_replicas_in_sync=workers)


def cardinality(dataset: Any) -> int:
    return int(dataset.cardinality())


def unknown_length(what: str, count: int) -> DataError:
    word = "infinite" if count == -1 else "of unknown length"
    return DataError(f"{what} is {word} (cardinality {count}), so it cannot be cut into blocks. Received: "
                     f"steps_per_epoch=None; expected steps_per_epoch=N (the batches one round reads over all "
                     f"workers), or a finite dataset whose length TensorFlow knows (e.g. "
                     f"dataset.apply(tf.data.experimental.assert_cardinality(n)))")


class TFDatasetAdapter(InputAdapter):
    kind = KIND

    def __init__(self, dataset: Any = None, dataset_fn: Any = None, steps_per_epoch: int | None = None) -> None:
        require_tensorflow_backend()
        self.dataset, self.dataset_fn, self.steps = dataset, dataset_fn, steps_per_epoch
        if dataset_fn is not None:
            self.kind = "dataset_fn"  # the function builds each worker's shard

    def length(self) -> int:
        if self.dataset_fn is not None:
            raise DataError("A `dataset_fn` builds each worker's own shard, so the whole input has no length. "
                            "Received: dataset_fn; its shards' lengths are read per worker")
        count = cardinality(self.dataset)
        if self.steps is not None:
            if count >= 0 and self.steps > count:
                raise DataError(f"`steps_per_epoch` asks for more batches than the tf.data.Dataset holds. "
                                f"Received: steps_per_epoch={self.steps}, cardinality {count}")
            return self.steps
        if count < 0:
            raise unknown_length("The tf.data.Dataset", count)
        return count

    def shard_lengths(self, workers: int) -> list[int] | None:
        if self.dataset_fn is None:
            return None
        if self.steps is not None:
            share = [self.steps * (i + 1) // workers - self.steps * i // workers for i in range(workers)]
            return share
        counts = [cardinality(self.shard(i, workers)) for i in range(workers)]
        for worker, count in enumerate(counts):
            if count < 0:
                raise unknown_length(f"The dataset dataset_fn built for worker {worker + 1} of {workers}", count)
        return counts

    def shard(self, worker: int, workers: int) -> Any:
        built = self.dataset_fn(input_context(worker, workers))
        if not is_tf_dataset(built):
            raise DataError(f"`dataset_fn` must return a tf.data.Dataset. Received: {type(built).__name__}")
        return built

    def can_hold_out(self) -> bool:
        return self.dataset_fn is None and cardinality(self.dataset) >= 0

    def first_batch(self) -> tuple[np.ndarray, np.ndarray]:
        dataset = self.dataset if self.dataset_fn is None else self.shard(0, 1)
        for element in dataset.take(1).as_numpy_iterator():
            return as_pair(element, self.kind)
        raise DataError(f"The {self.kind} is empty. Received: no batches; expected at least one")

    def read_split(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        if self.dataset_fn is not None:
            raise DataError("A `dataset_fn` has no end to hold an evaluation split out of. Received: "
                            "validation_data=None; expected validation_data=(x, y) or a dataset")
        part = self.dataset.skip(start).take(end - start)
        return concatenate(part.as_numpy_iterator(), self.kind, "evaluation split")
