"""class_weight and sample_weight as the workers apply them: Keras' product, checked by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.data.weights import check_class_coverage, check_class_weight, training_weights
from mpi_trainer.errors import ConfigError


def test_class_weight_times_sample_weight_per_row():
    y = np.array([0, 1, 1, 2])
    weights = training_weights(y, {0: 1.0, 1: 3.0, 2: 0.5}, np.array([1.0, 2.0, 1.0, 4.0]))
    assert weights.tolist() == [1.0, 6.0, 3.0, 2.0]


def test_one_hot_labels_take_the_weight_of_their_arg_max_and_no_weights_mean_none():
    y = np.array([[0.0, 1.0], [1.0, 0.0]])
    assert training_weights(y, {0: 2.0, 1: 5.0}, None).tolist() == [5.0, 2.0]
    assert training_weights(y, None, None) is None


@pytest.mark.parametrize("given, fragment", [
    ({1: 1.0, 2: 2.0}, "must have the keys 0 to one less than the number of classes"),
    ({0: -1.0}, "values must be finite numbers >= 0"),
    ([1.0, 2.0], "must be a dict mapping class indices to weights"),
    ({"a": 1.0}, "must map integer class indices to numbers"),
])
def test_bad_class_weight_is_refused_naming_it(given, fragment):
    with pytest.raises(ConfigError, match="`class_weight`") as info:
        check_class_weight(given)
    assert fragment in str(info.value)


def test_every_class_needs_a_weight():
    with pytest.raises(ConfigError, match="gives 2 weights but the labels have 3 classes"):
        check_class_coverage({0: 1.0, 1: 2.0}, 3, True)
