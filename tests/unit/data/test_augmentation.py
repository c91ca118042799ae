"""Real-time augmentation: training batches change, evaluation data never does."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.config import ConfigError, load_config
from mpi_trainer.data.augmentation import augment, build_augmenter, check_image_input
from mpi_trainer.errors import DataError


def _cfg(*overrides: str):
    return load_config(None, ["data.augmentation.enabled=true", *overrides])


@pytest.mark.parametrize("transform", ["data.augmentation.shift=0.2", "data.augmentation.rotation=0.1",
                                       "data.augmentation.zoom=0.3", "data.augmentation.flip='horizontal'"])
def test_each_transform_changes_batches_and_leaves_the_input_alone(transform):
    others = ["data.augmentation.shift=0.0"] if "shift" not in transform else []
    augmenter = build_augmenter(_cfg(*others, transform).data.augmentation, seed=1)
    x = np.random.default_rng(0).random((16, 8, 8, 1)).astype(np.float32)
    original = x.copy()
    first, second = augment(x, augmenter), augment(x, augmenter)
    assert first.shape == x.shape and first.dtype == np.float32
    assert not np.allclose(first, x) and not np.allclose(first, second)
    np.testing.assert_array_equal(x, original)


def test_disabled_or_empty_pipeline_is_identity():
    assert build_augmenter(load_config(None, []).data.augmentation, 0) is None
    assert build_augmenter(_cfg("data.augmentation.shift=0.0").data.augmentation, 0) is None
    x = np.ones((2, 4, 4, 1), np.float32)
    assert augment(x, None) is x


def test_augmentation_on_tabular_data_and_bad_settings_are_errors():
    with pytest.raises(DataError, match=r"Received: data.augmentation.enabled=True with input shape \(4,\)"):
        check_image_input(_cfg().data.augmentation, (4,))
    with pytest.raises(ConfigError, match=r"`data.augmentation.flip` must be one of \['none', 'horizontal'"):
        _cfg("data.augmentation.flip='sideways'")
    with pytest.raises(ConfigError, match=r"Received: data.augmentation.zoom=1.5"):
        _cfg("data.augmentation.zoom=1.5")
