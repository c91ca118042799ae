"""Pipelines as input (tf.data, dataset_fn, PyDataset, generator): blocks, splits, and what each refuses."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

from mpi_trainer.config import config_from_dict
from mpi_trainer.data.adapters import get_input_adapter
from mpi_trainer.data.adapters.tf_dataset import input_context
from mpi_trainer.data.streamed import check_allows, pipeline_dataset
from mpi_trainer.errors import DataError


def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int64)


class DigitBatches(keras.utils.PyDataset):
    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int) -> None:
        super().__init__()
        self.x, self.y, self.batch, self.seen = x, y, batch, []

    def __len__(self) -> int:
        return math.ceil(len(self.x) / self.batch)

    def __getitem__(self, index: int):
        self.seen.append(index)
        return self.x[index * self.batch:(index + 1) * self.batch], self.y[index * self.batch:(index + 1) * self.batch]


def endless(x: np.ndarray, y: np.ndarray, batch: int, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        rows = rng.integers(0, len(x), batch)
        yield x[rows], y[rows]


def config(**data):
    return config_from_dict({"data": {"source": "pipeline", **data}, "train": {"epochs": 2, "batch_size": 64}})


def test_dataset_fn_receives_each_workers_input_context():
    x, y = digits()
    seen = []

    def dataset_fn(context):
        seen.append((context.input_pipeline_id, context.num_input_pipelines))
        return tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines,
                                                                context.input_pipeline_id).batch(50)

    adapter = get_input_adapter(dataset_fn)
    data = pipeline_dataset("digits", adapter, (x[:100], y[:100]), config(), workers=2)
    assert data.train.block_bounds(2) == [(0, 18), (18, 36)]  # 899 and 898 rows, 18 batches each
    assert (1, 2) in seen and len(data.y_test) == 100
    second = adapter.dataset_fn(input_context(1, 2))  # what worker 2's share is built from
    first = next(iter(second))
    assert np.array_equal(first[1].numpy(), y[1:100:2])


def test_py_dataset_without_length_is_refused():
    class Endless(keras.utils.PyDataset):
        def __getitem__(self, index):
            return np.zeros((2, 3)), np.zeros(2)

        @property
        def num_batches(self):
            return None

    with pytest.raises(DataError, match=r"must define `__len__`.*Received: Endless without a length"):
        get_input_adapter(Endless())


def test_generator_needs_steps_per_epoch_and_validation_data():
    x, y = digits()
    with pytest.raises(DataError, match=r"Received: steps_per_epoch=None; expected steps_per_epoch=N"):
        get_input_adapter(endless(x, y, 32, 0))
    adapter = get_input_adapter(endless(x, y, 32, 0), steps_per_epoch=10)
    with pytest.raises(DataError, match=r"no end to hold a test split out of. Received: validation_data=None"):
        pipeline_dataset("gen", adapter, None, config(), workers=2)


def test_infinite_tf_dataset_without_steps_is_refused():
    x, y = digits()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
    adapter = get_input_adapter(dataset)
    with pytest.raises(DataError, match=r"is infinite \(cardinality -1\).*Received: steps_per_epoch=None"):
        pipeline_dataset("digits", adapter, (x, y), config(), workers=2)


def test_refused_settings_name_the_input_type():
    x, y = digits()
    adapter = get_input_adapter(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))
    cases = {"data": {"placement": "scatter"}, "data.increment": {"enabled": True},
             "data.augmentation": {"enabled": True, "flip": "horizontal"}}
    expected = {"data": r"`data.placement` has rank 0 read the data and send it to every worker, which a "
                        r"tf.data.Dataset",
                "data.increment": r"`data.increment.enabled` adds a draw .* Received: "
                                  r"data.increment.enabled=True with x of kind 'tf.data.Dataset'",
                "data.augmentation": r"`data.augmentation.enabled` .* x of kind 'tf.data.Dataset'"}
    for section, values in cases.items():
        table = {"data": {"source": "pipeline"}}
        parts = section.split(".")
        table["data"].update(values) if len(parts) == 1 else table["data"].update({parts[1]: values})
        with pytest.raises(DataError, match=expected[section]):
            check_allows(config_from_dict(table), adapter)
    generator = get_input_adapter(endless(x, y, 32, 0), steps_per_epoch=4)
    with pytest.raises(DataError, match=r"`data.rebalance` sizes each worker's block.*x of kind 'generator'"):
        check_allows(config_from_dict({"data": {"source": "pipeline", "rebalance": True}}), generator)


def test_y_with_a_dataset_and_a_generator_function_are_refused():
    x, y = digits()
    with pytest.raises(DataError, match=r"When providing `x` as a tf.data.Dataset, `y` should not be passed"):
        get_input_adapter(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), y)
    with pytest.raises(DataError, match=r"pass the generator it returns"):
        get_input_adapter(endless)


@pytest.mark.parametrize("table, kind, fragment", [
    ({"model": {"optimizer": "lbfgs"}}, "tf.data", r"`model.optimizer` holds each block in memory"),
    ({"aggregation": {"method": "best"}}, "generator", r"`aggregation.method` has the workers score shared"),
    ({"evaluation": {"where": "workers"}}, "generator", r"`evaluation.where` has the workers score shared"),
])
def test_every_other_refusal_names_the_input(table, kind, fragment):
    """What a source read as a pipeline cannot do besides what its kind of input refuses."""
    x, y = digits()
    adapter = (get_input_adapter(tf.data.Dataset.from_tensor_slices((x, y)).batch(32)) if kind == "tf.data"
               else get_input_adapter(endless(x, y, 32, 0), steps_per_epoch=4))
    cfg = config_from_dict({"data": {"source": "pipeline"}, **table})
    with pytest.raises(DataError, match=fragment + r".*which a (tf.data.Dataset|generator) does not allow"):
        check_allows(cfg, adapter)


def test_a_source_s_kind_refuses_what_a_script_s_x_of_that_kind_refuses():
    """One home for what a kind of input cannot do: the same message for a source and for fit's ``x``."""
    from mpi_trainer.data.adapters.refusals import input_refusals

    x, y = digits()
    adapter = get_input_adapter(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))
    cfg = config_from_dict({"data": {"source": "pipeline"}, "train": {"sync_every": 4}})
    with pytest.raises(DataError) as info:
        check_allows(cfg, adapter)
    assert str(info.value) == input_refusals(cfg, "tf.data.Dataset")[0]
    assert str(info.value).startswith("`train.sync_every` combines the workers every few steps of arrays")
    assert input_refusals(cfg, "arrays") == []


def test_a_dataset_with_fewer_batches_than_workers_leaves_a_shard_empty():
    x, y = digits()
    adapter = get_input_adapter(tf.data.Dataset.from_tensor_slices((x[:40], y[:40])).batch(20))
    data = pipeline_dataset("tiny", adapter, (x[:10], y[:10]), config(), workers=3)
    with pytest.raises(DataError, match=r"every worker needs at least one of the batches of the tf.data.Dataset. "
                                        r"Received: 2 batches for 3 workers"):
        data.train.block_bounds(3)


def test_tf_data_is_refused_off_tensorflow(monkeypatch):
    x, y = digits()
    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")
    with pytest.raises(DataError, match=r"A tf.data.Dataset is read on the TensorFlow backend only. Received: "
                                        r"KERAS_BACKEND='jax'"):
        get_input_adapter(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))
