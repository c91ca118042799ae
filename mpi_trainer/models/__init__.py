"""Model resolution, compilation, and the description that travels to workers.

The scheduler builds the model once (zoo name or ``package.module:function``),
then broadcasts a :class:`ModelSpec`: architecture JSON plus compile settings.
Workers rebuild from the spec, so every rank trains the same graph.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError


@dataclass
class ModelSpec:
    architecture: str
    optimizer: dict[str, Any] | None  # None under L-BFGS
    loss: Any
    user_module: str | None


def _resolve_builder(cfg: ModelConfig) -> tuple[Any, str | None]:
    from mpi_trainer.models.zoo import ZOO

    name = cfg.name
    if name in ZOO:
        return functools.partial(ZOO[name], activation=cfg.activation), None
    module_name, sep, function_name = name.partition(":")
    if not sep or not module_name or not function_name:
        raise ConfigError(f"`model.name` must be one of {sorted(ZOO)} or `package.module:function`. "
                          f"Received: model.name={name!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"`model.name` names a module that cannot be imported ({exc}). "
                          f"Received: model.name={name!r}") from None
    builder = getattr(module, function_name, None)
    if not callable(builder):
        raise ConfigError(f"`model.name`: module {module_name!r} has no function {function_name!r}. "
                          f"Received: model.name={name!r}")
    return builder, module_name


def make_optimizer(cfg: ModelConfig) -> Any:
    """The Keras optimizer ``model.optimizer`` names; None for 'lbfgs', which runs outside Keras."""
    import keras

    if cfg.uses_lbfgs:
        return None
    try:
        optimizer = keras.optimizers.get(cfg.optimizer)
    except ValueError:
        raise ConfigError(f"`model.optimizer` must name a Keras optimizer such as 'adam' or 'sgd'. "
                          f"Received: model.optimizer={cfg.optimizer!r}") from None
    optimizer.learning_rate = cfg.learning_rate
    return optimizer


def implied_loss(model: Any, cfg: ModelConfig | None = None) -> str:
    """The loss for integer labels, given ``model.loss`` and ``model.activation``.

    One output unit -> binary cross-entropy; squared error and sigmoid outputs
    compare against one-hot labels; otherwise sparse categorical cross-entropy.
    """
    from mpi_trainer.models import losses

    units = model.outputs[0].shape[-1]
    if cfg is not None and cfg.loss == "squared_error":
        return losses.SQUARED_ERROR
    if units == 1:
        return "binary_crossentropy"
    if cfg is not None and cfg.activation == "sigmoid":
        return losses.SIGMOID_CROSS_ENTROPY
    return "sparse_categorical_crossentropy"


def _serialise_loss(loss: Any) -> Any:
    import keras

    return loss if isinstance(loss, (str, type(None))) else keras.losses.serialize(loss)


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> tuple[Any, ModelSpec]:
    """Build and compile the configured model on the scheduler; return it and its spec."""
    import keras

    builder, user_module = _resolve_builder(cfg)
    try:
        model = builder(tuple(input_shape), int(num_classes))
    except ValueError as exc:
        raise ConfigError(f"`model.name` {cfg.name!r} cannot be built for input shape "
                          f"{tuple(input_shape)} and {num_classes} classes: {exc}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError(f"`model.name` {cfg.name!r} must return a keras.Model. "
                          f"Received: {type(model).__name__}")
    check_input(model, cfg.name, input_shape)
    check_output(model, cfg.name, num_classes)
    if getattr(model, "optimizer", None) is not None and getattr(model, "loss", None) is not None:
        optimizer, loss = model.optimizer, model.loss
    else:
        optimizer, loss = make_optimizer(cfg), implied_loss(model, cfg)
    if cfg.uses_lbfgs:
        optimizer = None  # L-BFGS moves the weights itself; a user model's own optimizer is not used
    spec = ModelSpec(model.to_json(), None if optimizer is None else keras.optimizers.serialize(optimizer),
                     _serialise_loss(loss), user_module)
    compile_model(model, spec)
    return model, spec


def check_input(model: Any, name: str, input_shape: tuple[int, ...]) -> None:
    """The model's input must fit one sample of the data (e.g. 3 channels vs 1 is an error)."""
    expected = tuple(model.inputs[0].shape[1:])
    data = tuple(input_shape)
    fits = len(expected) == len(data) and all(e is None or e == d for e, d in zip(expected, data))
    if not fits:
        what = ""
        if len(expected) == len(data) == 3 and expected[-1] not in (None, data[-1]):
            what = f" ({expected[-1]}-channel model on {data[-1]}-channel data)"
        raise ConfigError(f"`model.name` {name!r} expects inputs of shape {expected} but the data's "
                          f"samples have shape {data}{what}; build the model for the data's input shape")


def check_output(model: Any, name: str, num_classes: int) -> None:
    units = model.outputs[0].shape[-1]
    if units not in (num_classes, 1) or (units == 1 and num_classes > 2):
        raise ConfigError(f"`model.name` {name!r} outputs {units} units but the data has "
                          f"{num_classes} classes; expected {num_classes} output units")


def compile_model(model: Any, spec: ModelSpec) -> None:
    import keras

    from mpi_trainer.models import losses

    # No optimizer (L-BFGS): the model is compiled only for its loss and evaluation.
    optimizer = None if spec.optimizer is None else keras.optimizers.deserialize(spec.optimizer)
    model.compile(optimizer=optimizer, loss=losses.resolve(spec.loss),
                  metrics=["accuracy"])


def rebuild_model(spec: ModelSpec) -> Any:
    """Recreate and compile the scheduler's model from its spec (on a worker)."""
    import keras

    if spec.user_module:
        importlib.import_module(spec.user_module)  # registers the user's custom objects
    model = keras.models.model_from_json(spec.architecture)
    compile_model(model, spec)
    return model


def evaluate_model(model: Any, x: Any, y: Any, batch_size: int) -> dict[str, float]:
    """Loss and metrics of ``model`` on ``(x, y)``, as ``model.evaluate`` gives them, at a fraction of its cost.

    ``model.evaluate`` sets up a data adapter, callbacks and a progress loop on
    every call, about 0.1 s, which the scheduler pays every round while the
    workers wait. ``test_on_batch`` runs the same compiled test step on one
    batch; the batches' results, weighted by their sizes, are the sample means
    ``evaluate`` reports.
    """
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty split")
    totals: dict[str, float] = {}
    for start in range(0, len(x), batch_size):
        stop = min(start + batch_size, len(x))
        result = model.test_on_batch(x[start:stop], y[start:stop], return_dict=True)
        for name, value in result.items():
            totals[name] = totals.get(name, 0.0) + float(value) * (stop - start)
    return {name: total / len(x) for name, total in totals.items()}
