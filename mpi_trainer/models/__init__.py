"""Model resolution, compilation, and the description that travels to workers.

The scheduler builds the model once (zoo name or ``package.module:function``),
then broadcasts a :class:`ModelSpec`: architecture JSON plus compile settings.
Workers rebuild from the spec, so every rank trains the same graph.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError


@dataclass
class ModelSpec:
    architecture: str
    optimizer: dict[str, Any] | None  # None under L-BFGS
    loss: Any  # a Keras loss identifier, one of :mod:`.losses`' names, or a serialised loss
    user_module: str | None
    metrics: list[Any] = field(default_factory=lambda: ["accuracy"])  # identifiers or serialised metrics
    user_compiled: bool = False  # the model function compiled the model: its own optimizer, loss and metrics


def _resolve_builder(cfg: ModelConfig, builder: Any = None) -> tuple[Any, str | None]:
    """The function that builds the model, and the module workers import for its custom objects.

    ``builder`` (from :func:`mpi_trainer.fit`) is a callable or a built model; else ``model.name``.
    """
    from mpi_trainer.models.zoo import ZOO

    if builder is not None:
        return _given_builder(builder)
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


def _given_builder(builder: Any) -> tuple[Any, str | None]:
    import keras

    if isinstance(builder, keras.Model):
        return (lambda input_shape, num_outputs: _built(builder, input_shape)), _module_of(builder)
    if not callable(builder):
        raise ConfigError(f"`model` must be a Keras model, a function (input_shape, num_outputs) -> model, "
                          f"a zoo name or 'package.module:function'. Received: {type(builder).__name__}")
    return builder, _module_of(builder)


def _built(model: Any, input_shape: tuple[int, ...]) -> Any:
    """A model given unbuilt (a ``Sequential`` without ``keras.Input``), built for the data's samples."""
    if not model.built:
        model.build((None, *input_shape))
    return model


def _module_of(thing: Any) -> str | None:
    """The module a worker imports so that the user's custom layers are registered (not ``__main__``:
    workers run the same script, which registers them itself)."""
    module = getattr(thing, "__module__", None) or type(thing).__module__
    return None if module in ("__main__", "builtins") or module.startswith("keras") else module


def implied_loss(model: Any, cfg: ModelConfig | None = None, classes: bool = True) -> str:
    """The loss ``model.loss`` names for this model and these labels.

    ``cross_entropy`` on integer class labels: binary cross-entropy for one
    output unit, per-class binary cross-entropy for sigmoid outputs, sparse
    categorical cross-entropy otherwise; on other targets (one-hot, multi-label,
    0/1 values) binary or categorical cross-entropy as the output suggests.
    ``squared_error``: against the one-hot label for classes, plain mean squared
    error for other targets. Any other value is a Keras loss identifier, used as it is.
    """
    from mpi_trainer.models import losses

    name = "cross_entropy" if cfg is None else cfg.loss
    units = model.outputs[0].shape[-1]
    sigmoid = cfg is not None and cfg.activation == "sigmoid"
    if name == "squared_error":
        return losses.SQUARED_ERROR if classes else "mean_squared_error"
    if name != "cross_entropy":
        return name
    if units == 1 or (sigmoid and not classes):
        return "binary_crossentropy"
    if classes:
        return losses.SIGMOID_CROSS_ENTROPY if sigmoid else "sparse_categorical_crossentropy"
    return "categorical_crossentropy"


def configured_metrics(cfg: ModelConfig, classes: bool, loss: str) -> list[str]:
    """``model.metrics``, or the task's default: accuracy for classes and cross-entropy, none for regression."""
    if cfg.metrics:
        return list(cfg.metrics)
    return ["accuracy"] if classes or "crossentropy" in loss else []


def check_compile_names(cfg: ModelConfig) -> None:
    """``model.loss`` and ``model.metrics`` must be names Keras knows (checked before anything trains)."""
    import keras

    from mpi_trainer.models import losses

    if cfg.loss not in losses.CONFIG_NAMES:
        try:
            keras.losses.get(cfg.loss)
        except ValueError:
            raise ConfigError(f"`model.loss` must be 'cross_entropy', 'squared_error' or a Keras loss identifier "
                              f"such as 'mse' or 'categorical_crossentropy'. "
                              f"Received: model.loss={cfg.loss!r}") from None
    for metric in cfg.metrics:
        if metric in ("accuracy", "acc", "crossentropy", "ce"):
            continue
        try:
            keras.metrics.get(metric)
        except ValueError:
            raise ConfigError(f"`model.metrics` must list Keras metric identifiers such as 'accuracy', 'mae' or "
                              f"'auc'. Received: model.metrics={cfg.metrics!r} ({metric!r} is unknown)") from None


def _serialise(item: Any, kind: str) -> Any:
    import keras

    if isinstance(item, (str, type(None), dict)):
        return item
    return getattr(keras, kind).serialize(item)


def compile_settings(model: Any, cfg: ModelConfig, classes: bool) -> tuple[Any, Any, list[Any], bool]:
    """(optimizer, loss, metrics, user-compiled?): the model's own compile when its function compiled
    it, else the config's (``model.optimizer``, ``model.loss``, ``model.metrics``)."""
    if getattr(model, "optimizer", None) is not None and getattr(model, "loss", None) is not None:
        metrics = model.get_compile_config().get("metrics") or []
        return model.optimizer, _serialise(model.loss, "losses"), list(metrics), True
    check_compile_names(cfg)
    loss = implied_loss(model, cfg, classes)
    return make_optimizer(cfg), loss, configured_metrics(cfg, classes, loss), False


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_outputs: int, classes: bool = True,
                builder: Any = None) -> tuple[Any, ModelSpec]:
    """Build and compile the configured model on the scheduler; return it and its spec.

    The model function is called as ``function(input_shape, num_outputs)``:
    ``num_outputs`` is the number of classes for integer labels, the target width otherwise.
    """
    import keras

    builder, user_module = _resolve_builder(cfg, builder)
    what = f"{num_outputs} classes" if classes else f"targets of width {num_outputs}"
    try:
        model = builder(tuple(input_shape), int(num_outputs))
    except Exception as exc:  # whatever the user's code or Keras raises: every rank must hear of it
        raise ConfigError(f"`model` {cfg.name!r} cannot be built for input shape {tuple(input_shape)} and "
                          f"{what}: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError(f"`model.name` {cfg.name!r} must return a keras.Model. "
                          f"Received: {type(model).__name__}")
    check_input(model, cfg.name, input_shape)
    if classes:
        check_output(model, cfg.name, num_outputs)
    optimizer, loss, metrics, user_compiled = compile_settings(model, cfg, classes)
    if cfg.uses_lbfgs:
        optimizer = None  # L-BFGS moves the weights itself; a user model's own optimizer is not used
    try:
        spec = ModelSpec(model.to_json(), None if optimizer is None else keras.optimizers.serialize(optimizer),
                         loss, user_module, metrics, user_compiled)
        compile_model(model, spec)
    except Exception as exc:  # an unserialisable layer or a bad compile: every rank must hear of it
        raise ConfigError(f"`model` {cfg.name!r} cannot be described to the workers or compiled: "
                          f"{type(exc).__name__}: {exc}") from None
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
    """Integer class labels: a single output needs one unit per class (or one unit for two classes)."""
    if len(model.outputs) != 1:
        return
    units = model.outputs[0].shape[-1]
    if units not in (num_classes, 1) or (units == 1 and num_classes > 2):
        raise ConfigError(f"`model.name` {name!r} outputs {units} units but the data has {num_classes} classes "
                          f"(integer labels are class indices); expected {num_classes} output units (targets "
                          f"that are not class indices are given as floats, e.g. one-hot or regression values)")


def compile_model(model: Any, spec: ModelSpec) -> None:
    import keras

    from mpi_trainer.models import losses

    # No optimizer (L-BFGS): the model is compiled only for its loss and evaluation.
    optimizer = None if spec.optimizer is None else keras.optimizers.deserialize(spec.optimizer)
    loss = keras.losses.deserialize(spec.loss) if isinstance(spec.loss, dict) else losses.resolve(spec.loss)
    metrics = [keras.metrics.deserialize(m) if isinstance(m, dict) else m for m in spec.metrics]
    model.compile(optimizer=optimizer, loss=loss, metrics=metrics)


def rebuild_model(spec: ModelSpec) -> Any:
    """Recreate and compile the scheduler's model from its spec (on a worker)."""
    import keras

    import mpi_trainer.models.packed  # noqa: F401 - registers InputColumns, which a dict-input model uses

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
    batch (after resetting the metrics); the metrics' states of all batches are
    summed, which is exact for every metric whose state is a sum (means, counts,
    confusion counts such as AUC's), and the result is read from the sum.
    """
    if len(x) == 0:
        raise ValueError("cannot evaluate on an empty split")
    return metrics_from_state(model, summed_metric_state(model, x, y, batch_size))


def summed_metric_state(model: Any, x: Any, y: Any, batch_size: int) -> list[np.ndarray]:
    """The compiled metrics' state summed over the batches of ``(x, y)``; zeros when it has no rows.

    States of disjoint shards add up to the state of their union, which is how
    workers that each score a shard of a split give the exact result together.
    """
    total: list[np.ndarray] | None = None
    for start in range(0, len(x), batch_size):
        model.test_on_batch(x[start:start + batch_size], y[start:start + batch_size])
        state = metric_state(model)  # of this batch alone: test_on_batch resets the metrics first
        total = state if total is None else [a + b for a, b in zip(total, state)]
    if total is None:  # no rows; a model that has scored before has built all its metrics
        model.reset_metrics()
        total = [np.zeros_like(state) for state in metric_state(model)]
    return total


def metric_state(model: Any) -> list[np.ndarray]:
    """The compiled metrics' variables (the loss tracker's included), as NumPy arrays."""
    return [np.asarray(variable.numpy()) for metric in model.metrics for variable in metric.variables]


def flat_metric_state(state: list[np.ndarray]) -> np.ndarray:
    """Metric state as one float64 vector, for a sum-reduction over MPI."""
    return np.concatenate([np.ravel(part).astype(np.float64) for part in state])


def metrics_from_flat(model: Any, vector: np.ndarray) -> dict[str, float]:
    """Every metric of ``model`` read from a summed :func:`flat_metric_state` vector."""
    shapes = [np.shape(part) for part in metric_state(model)]
    ends = np.cumsum([int(np.prod(shape)) for shape in shapes])
    if not ends.size or ends[-1] != vector.size:
        raise ValueError(f"metric state of {vector.size} values does not fit this model's metrics "
                         f"({int(ends[-1]) if ends.size else 0} values)")
    parts = np.split(vector, ends[:-1])
    return metrics_from_state(model, [part.reshape(shape) for part, shape in zip(parts, shapes)])


def metrics_from_state(model: Any, state: list[np.ndarray]) -> dict[str, float]:
    """Load summed metric variables back into ``model`` and read every metric's result."""
    variables = [variable for metric in model.metrics for variable in metric.variables]
    for variable, value in zip(variables, state, strict=True):
        variable.assign(value)
    return {name: float(np.asarray(value)) for name, value in model.get_metrics_result().items()}
