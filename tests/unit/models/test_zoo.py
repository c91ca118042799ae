"""The model zoo, output activation / loss choices, and shape checks before training."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.config import ConfigError, load_config
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model


def _model_cfg(*overrides: str):
    return load_config(None, list(overrides)).model


@pytest.mark.parametrize("name", ["lenet", "nin", "resnet20", "densenet"])
@pytest.mark.parametrize("shape, classes", [((28, 28, 1), 10), ((32, 32, 3), 10), ((8, 8, 1), 4)])
def test_image_models_build_for_the_data_shape(name, shape, classes):
    model = build_model(_model_cfg(f"model.name={name}"), shape, classes)
    assert tuple(model.inputs[0].shape[1:]) == shape and model.outputs[0].shape[-1] == classes
    out = model.predict(np.zeros((2, *shape), np.float32), verbose=0)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)  # softmax output


@pytest.mark.parametrize("name", ["lenet", "nin", "resnet20", "densenet"])
def test_image_models_refuse_tabular_data(name):
    with pytest.raises(ConfigError, match=rf"'{name}' cannot be built for input shape \(4,\).*image input"):
        build_model(_model_cfg(f"model.name={name}"), (4,), 3)


def test_three_channel_model_on_one_channel_data_is_an_error():
    with pytest.raises(ConfigError, match=r"\(3-channel model on 1-channel data\)"):
        build_model(_model_cfg("model.name=tests.unit.models.test_zoo:cifar_only"), (28, 28, 1), 10)


def test_too_few_output_units_for_the_classes_is_an_error():
    with pytest.raises(ConfigError, match="outputs 10 units but the data has 12 classes"):
        build_model(_model_cfg("model.name=tests.unit.models.test_zoo:cifar_only"), (32, 32, 3), 12)


def cifar_only(input_shape, num_classes):
    """A user model that ignores the data's shape: 32x32x3 in, 10 classes out."""
    return keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Flatten(), keras.layers.Dense(10)])


@pytest.mark.parametrize("activation, loss, expected", [
    ("softmax", "cross_entropy", "sparse_categorical_crossentropy"),
    ("sigmoid", "cross_entropy", "one_hot_binary_crossentropy"),
    ("softmax", "squared_error", "one_hot_squared_error"),
    ("sigmoid", "squared_error", "one_hot_squared_error"),
])
def test_softmax_regression_choices_learn_iris(activation, loss, expected):
    cfg = load_config(None, ["data.source=iris", "model.name=softmax_regression", "model.learning_rate=0.1",
                             f"model.activation={activation}", f"model.loss={loss}"])
    data = load_dataset(cfg.data, 0)
    model = build_model(cfg.model, data.input_shape, data.num_outputs)
    assert getattr(model.loss, "__name__", model.loss) == expected  # our one-hot losses are functions
    assert model.count_params() == 4 * 3 + 3
    assert model.layers[-1].get_config()["activation"] == activation
    model.fit(data.x_train, data.y_train, epochs=20, batch_size=32, verbose=0)
    assert model.evaluate(data.x_test, data.y_test, verbose=0, return_dict=True)["accuracy"] >= 0.8


def test_a_bad_activation_names_the_key():
    with pytest.raises(ConfigError, match=r"`model.activation` must be one of .* Received: model.activation='tanh'$"):
        _model_cfg("model.activation=tanh")


@pytest.mark.parametrize("key, value", [("loss", "'hinj'"), ("metrics", "['accuracy', 'aucc']")])
def test_loss_and_metric_names_keras_does_not_know_fail_when_the_model_is_built(key, value):
    cfg = _model_cfg(f"model.{key}={value}")
    with pytest.raises(ConfigError, match=rf"`model.{key}` must .* Keras .* Received: model.{key}="):
        build_model(cfg, (4,), 3)


@pytest.mark.parametrize("config, shape", [("configs/mnist_nin.toml", (28, 28, 1)),
                                           ("configs/cifar10_resnet.toml", (32, 32, 3)),
                                           ("configs/cifar10_densenet.toml", (32, 32, 3))])
def test_shipped_image_configs_build_their_model_for_their_dataset(config, shape):
    cfg = load_config(config)
    model = build_model(cfg.model, shape, 10)
    assert model.name == cfg.model.name and model.outputs[0].shape[-1] == 10
