"""Model resolution and compilation (in-process, no MPI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError
from mpi_trainer.models import build_model, evaluate_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for user_models


def test_lenet_has_the_originating_parameter_count():
    model = build_model(ModelConfig(name="lenet"), (28, 28, 1), 10)
    assert model.count_params() == 484_714
    assert sum(w.size for w in model.get_weights()) * 4 == 1_938_856  # 1.85 MiB of float32


def test_uncompiled_user_model_is_compiled_from_config():
    cfg = ModelConfig(name="user_models:small_cnn", optimizer="sgd", learning_rate=0.05)
    model = build_model(cfg, (8, 8, 1), 10)
    assert model.loss == "sparse_categorical_crossentropy"
    assert type(model.optimizer).__name__.lower() == "sgd"
    assert float(model.optimizer.learning_rate) == pytest.approx(0.05)


def test_compiled_user_model_keeps_its_optimizer():
    model = build_model(ModelConfig(name="user_models:compiled_sgd"), (4,), 3)
    assert type(model.optimizer).__name__.lower() == "sgd"  # not the config's default optimizer
    assert float(model.optimizer.learning_rate) == pytest.approx(0.123)


def test_a_compiled_model_given_keeps_its_own_optimizer_object():
    import keras

    given = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    optimizer = keras.optimizers.SGD(learning_rate=0.123)
    given.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model = build_model(ModelConfig(name="given", optimizer="adam", learning_rate=0.5), (4,), 3, builder=given)
    assert model is given and model.optimizer is optimizer
    assert float(model.optimizer.learning_rate) == pytest.approx(0.123)


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


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_evaluate_model_gives_what_keras_evaluate_gives(name):
    import numpy as np

    model = build_model(ModelConfig(name=name), (8, 8, 1), 10)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(359, 8, 8, 1)).astype("float32"), rng.integers(0, 10, 359)
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)  # weights that give a non-trivial score
    expected = model.evaluate(x, y, batch_size=100, verbose=0, return_dict=True)
    got = evaluate_model(model, x, y, batch_size=100)  # 3 full batches and a partial one
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(float(value), rel=1e-5, abs=1e-6), key
    with pytest.raises(ValueError, match="empty split"):
        evaluate_model(model, x[:0], y[:0], batch_size=100)
