"""Building the model: a zoo name, ``package.module:function`` or the caller's own, checked against the data
and compiled by the config (unless the function compiled it). Every rank builds its own; rank 0's state
reaches the others before training.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import traceback
from typing import Any

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError, InputError
from mpi_trainer.models.compile_settings import compile_settings


def _resolve_builder(cfg: ModelConfig, builder: Any = None) -> Any:
    """The function that builds the model.

    ``builder`` (from :func:`mpi_trainer.fit`) is a callable or a built model; else ``model.name``.
    """
    from mpi_trainer.models.zoo import ZOO

    if builder is not None:
        return _given_builder(builder)
    name = cfg.name
    if name in ZOO:
        return functools.partial(ZOO[name], activation=cfg.activation)
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
    return builder


def _given_builder(builder: Any) -> Any:
    import keras

    if isinstance(builder, keras.Model):
        return lambda input_shape, num_outputs: _built(builder, input_shape)
    if not callable(builder):
        raise ConfigError(f"`model` must be a Keras model, a function (input_shape, num_outputs) -> model, "
                          f"a zoo name or 'package.module:function'. Received: {type(builder).__name__}")
    return builder


def _built(model: Any, input_shape: tuple[int, ...]) -> Any:
    """A model given unbuilt (a ``Sequential`` without ``keras.Input``), built for the data's samples."""
    if not model.built:
        model.build((None, *input_shape))
    return model


def build_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_outputs: int, classes: bool = True,
                builder: Any = None) -> Any:
    """Build the configured model for the data, checked against it, and compile it.

    The model function is called as ``function(input_shape, num_outputs)``:
    ``num_outputs`` is the number of classes for integer labels, the target width otherwise. A model the
    function compiled keeps its own optimizer, loss and metrics (not under L-BFGS, which has no Keras
    optimizer).
    """
    import keras

    from mpi_trainer.models import losses

    builder = _resolve_builder(cfg, builder)
    what = f"{num_outputs} classes" if classes else f"targets of width {num_outputs}"
    try:
        model = builder(tuple(input_shape), int(num_outputs))
    except Exception as exc:
        if not _is_bad_input(exc):
            raise  # a bug in the user's model function: it reaches the user with its traceback
        raise ConfigError(f"`model` {cfg.name!r} cannot be built for input shape {tuple(input_shape)} and "
                          f"{what}: {type(exc).__name__}: {exc}") from None
    if not isinstance(model, keras.Model):
        raise ConfigError(f"`model.name` {cfg.name!r} must return a keras.Model. "
                          f"Received: {type(model).__name__}")
    check_input(model, cfg.name, input_shape)
    if classes:
        check_output(model, cfg.name, num_outputs)
    optimizer, loss, metrics, user_compiled = compile_settings(model, cfg, classes)
    _check_outputs(model, cfg, user_compiled)
    if user_compiled and not cfg.uses_lbfgs:
        return model
    try:  # L-BFGS moves the weights itself: compiled for its loss and scoring only
        model.compile(optimizer=None if cfg.uses_lbfgs else optimizer,
                      loss=keras.losses.deserialize(loss) if isinstance(loss, dict) else losses.loss_by_name(loss),
                      metrics=metrics)
    except Exception as exc:
        if not _is_bad_input(exc, keras_values=True):
            raise
        raise ConfigError(f"`model` {cfg.name!r} cannot be compiled: {type(exc).__name__}: {exc}") from None
    return model


# Words of Keras' complaints about a model that does not fit the data it is built for.
_SHAPE_WORDS = re.compile(r"shape|ndim|incompatible|input", re.IGNORECASE)


def _is_bad_input(exc: Exception, keras_values: bool = False) -> bool:
    """Whether ``exc`` says the input was bad (one line for the user) rather than that code broke.

    Bad input is mpi_trainer's own :class:`~mpi_trainer.errors.InputError`, or a ``ValueError`` that
    Keras itself raised (the innermost frame is Keras'): about shapes when the model is built for the
    data (``keras_values=False``), any when it is compiled from the configured settings (a loss or
    metric Keras does not know). A ``ValueError`` the user's own code raised is a bug like any other.
    """
    if isinstance(exc, InputError):
        return True
    if not isinstance(exc, ValueError) or not _raised_in_keras(exc):
        return False
    return keras_values or bool(_SHAPE_WORDS.search(str(exc)))


def _raised_in_keras(exc: BaseException) -> bool:
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and f"{os.sep}keras{os.sep}" in frames[-1].filename


def _check_outputs(model: Any, cfg: ModelConfig, user_compiled: bool) -> None:
    """A model of several outputs is compiled by its function (a loss for its outputs), and not for L-BFGS."""
    if len(model.outputs) < 2:
        return
    if cfg.uses_lbfgs:
        raise ConfigError(f"`model.optimizer` = 'lbfgs' trains single-output models (its gradient is one loss). "
                          f"Received: a model with {len(model.outputs)} outputs; expected a Keras optimizer")
    if not user_compiled:
        raise ConfigError(f"A multi-output model must be compiled (with a loss for its outputs) before `fit`. "
                          f"Received: model {cfg.name!r}, not compiled, with {len(model.outputs)} outputs")


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
