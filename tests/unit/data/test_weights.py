"""class_weight as Keras takes it: checked before training with Keras' own adapters, and turned into the
rows' weights by Keras' own mapping (a class without a weight weighs 1)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from mpi_trainer.config import load_config
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.placement import HeldBlock, HeldRows
from mpi_trainer.data.weights import check_class_weight, keras_refusal
from mpi_trainer.errors import ConfigError

X, Y = np.random.default_rng(0).random((12, 4), dtype=np.float32), np.arange(12) % 3


def test_keras_refuses_class_weight_with_sample_weight_in_its_own_words():
    refusal = keras_refusal(X, Y, np.ones(12), {0: 1.0, 1: 2.0, 2: 1.0})
    assert refusal == "You cannot `class_weight` and `sample_weight` at the same time."
    assert keras_refusal(X, Y, None, {0: 1.0, 1: 2.0, 2: 1.0}) is None
    assert keras_refusal(X, Y, np.ones(12), None) is None


def test_a_generator_is_refused_without_reading_it_and_a_dataset_is_accepted():
    def batches():
        yield X, Y

    generator = batches()
    refusal = keras_refusal(generator, None, None, {0: 2.0})
    assert refusal and "`class_weight` is not supported for Python generator inputs" in refusal
    np.testing.assert_array_equal(next(generator)[0], X)  # its first batch is still there for the job
    assert keras_refusal(tf.data.Dataset.from_tensor_slices((X, Y)).batch(4), None, None, {0: 2.0}) is None
    weighted = tf.data.Dataset.from_tensor_slices((X, Y, np.ones(12))).batch(4)
    assert "`class_weight` and `sample_weight`" in keras_refusal(weighted, None, None, {0: 2.0})


def test_keras_accepts_any_classes_and_weighs_a_class_without_a_weight_as_one():
    assert check_class_weight({"1": 5, 4: 0.5}) == {1: 5.0, 4: 0.5}  # classes 0, 2, 3 keep a weight of 1
    rows = HeldRows(np.arange(12), X, Y)
    plan = SimpleNamespace(num_train=12, shuffle_seed=0, class_weight={1: 5.0},
                           block_bounds=block_bounds(12, 1))
    feed = HeldBlock(rows, plan, 1, load_config(None, [])).for_round(0)
    np.testing.assert_array_equal(feed.sample_weight, np.where(feed.y == 1, 5.0, 1.0))


@pytest.mark.parametrize("given, fragment", [
    ([1.0, 2.0], "must be a dict mapping class indices to weights"),
    ({"a": 1.0}, "must map integer class indices to numbers"),
])
def test_a_class_weight_that_is_not_a_mapping_of_classes_is_refused_naming_it(given, fragment):
    with pytest.raises(ConfigError, match="`class_weight`") as info:
        check_class_weight(given)
    assert fragment in str(info.value)


def test_fit_refuses_what_keras_refuses_as_bad_input_before_training():
    from mpi_trainer.api import _class_weight

    with pytest.raises(ConfigError, match="You cannot `class_weight` and `sample_weight` at the same time"):
        _class_weight({0: 1.0}, "mlp", (X, Y, np.ones(12), None))
    assert _class_weight({"1": 5}, "mlp", (X, Y, None, None)) == {1: 5.0}
