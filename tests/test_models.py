"""Model resolution and compilation (in-process, no MPI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError
from mpi_trainer.models import build_model, rebuild_model

sys.path.insert(0, str(Path(__file__).parent))


def test_lenet_has_the_originating_parameter_count():
    model, _ = build_model(ModelConfig(name="lenet"), (28, 28, 1), 10)
    assert model.count_params() == 484_714
    assert sum(w.size for w in model.get_weights()) * 4 == 1_938_856  # 1.85 MiB of float32


def test_uncompiled_user_model_is_compiled_from_config_and_rebuilt_identically():
    cfg = ModelConfig(name="user_models:small_cnn", optimizer="sgd", learning_rate=0.05)
    model, spec = build_model(cfg, (8, 8, 1), 10)
    assert spec.user_module == "user_models"
    assert spec.loss == "sparse_categorical_crossentropy"
    assert spec.optimizer["class_name"].lower() == "sgd"
    assert spec.optimizer["config"]["learning_rate"] == pytest.approx(0.05)
    clone = rebuild_model(spec)
    assert [w.shape for w in clone.get_weights()] == [w.shape for w in model.get_weights()]


def test_compiled_user_model_keeps_its_optimizer():
    _, spec = build_model(ModelConfig(name="user_models:compiled_sgd"), (4,), 3)
    assert spec.optimizer["class_name"].lower() == "sgd"
    assert spec.optimizer["config"]["learning_rate"] == pytest.approx(0.123)


def test_custom_layers_travel_through_the_spec():
    _, spec = build_model(ModelConfig(name="user_models:fails_on_rank"), (4,), 3)
    assert "FailOnRank" in spec.architecture
    rebuild_model(spec)


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("resnet9000", "must be one of"),
        ("user_models:absent", "has no function 'absent'"),
        ("no_such_module:fn", "cannot be imported"),
        ("user_models:wrong_classes", "outputs 4 units but the data has 3 classes"),
        ("user_models:not_a_model", "must return a keras.Model. Received: str"),
    ],
)
def test_bad_model_names_are_config_errors(name, fragment):
    with pytest.raises(ConfigError, match=fragment) as info:
        build_model(ModelConfig(name=name), (4,), 3)
    assert "model.name" in str(info.value)
