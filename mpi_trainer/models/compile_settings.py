"""Compile settings: the optimizer, the loss implied by the labels, the metrics, and their checks.

A model the user's function compiled keeps its own settings; otherwise they come from
``model.optimizer``, ``model.loss`` and ``model.metrics``, checked against Keras before training.
"""

from __future__ import annotations

from typing import Any

from mpi_trainer.config import ModelConfig
from mpi_trainer.errors import ConfigError


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

    units = model.outputs[0].shape[-1]
    sigmoid = cfg is not None and cfg.sigmoid_output
    if cfg is not None and cfg.squared_error:
        return losses.SQUARED_ERROR if classes else "mean_squared_error"
    if cfg is not None and not cfg.cross_entropy:
        return cfg.loss  # a Keras loss identifier
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
