"""Each worker's share of fit's input: disjoint, complete, values untouched, every kind Keras takes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mpi_trainer.data.adapters import PyDatasetShare, input_kind, pipeline_share
from mpi_trainer.trainer.shares import array_share, share_rows


@pytest.mark.parametrize("shuffle", [True, False])
def test_shares_partition_the_rows(shuffle):
    parts = [share_rows(103, 4, index, shuffle) for index in range(4)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(103))
    assert {len(part) for part in parts} <= {25, 26}
    if not shuffle:  # in order: contiguous blocks
        assert parts[0].tolist() == list(range(26))


def test_a_file_sorted_by_class_is_not_dealt_by_class():
    y = np.repeat(np.arange(3), 50)  # iris' layout
    for index in range(3):
        _, share_y, _ = array_share((np.zeros((150, 2)), y, None), 3, index, True)
        assert set(share_y.tolist()) == {0, 1, 2}


def test_array_values_dtypes_and_structures_are_kept():
    x = {"text": np.array(["a b", "c", "d e f", "g"], dtype=object), "pixels": np.arange(4, dtype=np.uint8)}
    y = [np.arange(4), np.arange(4, dtype=np.float32) / 2]
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    share_x, share_y, share_w = array_share((x, y, weights), 2, 1, False)
    assert share_x["text"].tolist() == ["d e f", "g"] and share_x["pixels"].dtype == np.uint8
    assert share_x["pixels"].tolist() == [2, 3]  # not scaled, not cast
    assert share_y[1].tolist() == [1.0, 1.5] and share_w.tolist() == [3.0, 4.0]


def test_a_dataset_is_sharded_element_by_element():
    dataset = tf.data.Dataset.range(10)
    assert [int(v) for v in pipeline_share(dataset, 3, 1)] == [1, 4, 7]
    assert input_kind(dataset) == "tf.data.Dataset"


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 7

    def __getitem__(self, index):
        return np.full((2, 1), index, dtype=np.float32), np.zeros(2)


def test_a_py_dataset_share_takes_every_nth_batch():
    share = pipeline_share(Batches(), 3, 2)
    assert isinstance(share, PyDatasetShare) and len(share) == 2
    assert [int(share[i][0][0, 0]) for i in range(len(share))] == [2, 5]


def test_a_generator_share_takes_every_nth_item():
    assert list(pipeline_share(iter(range(8)), 2, 1)) == [1, 3, 5, 7]
    assert input_kind(iter(range(3))) == "generator"


def test_a_kind_no_share_can_be_cut_from_is_refused_naming_it():
    """A generator function (fit takes the generator it returns) is named, not iterated into a wrong share."""
    from mpi_trainer.errors import DataError

    def batches():
        yield np.zeros((2, 1)), np.zeros(2)

    with pytest.raises(DataError, match=r"Received: x of kind 'generator function'; expected arrays, a "
                                        r"tf.data.Dataset, a keras.utils.PyDataset or a generator"):
        pipeline_share(batches, 2, 0)
