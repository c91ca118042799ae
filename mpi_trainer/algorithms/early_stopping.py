"""Early stopping on a per-round metric: which round was best, and when to stop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpi_trainer.config.schema import DEFAULT_MONITOR, EarlyStoppingConfig
from mpi_trainer.errors import ConfigError

# Parts of a metric's name that mark it as an error to minimise (losses, distances, error rates);
# any other metric (accuracy, AUC, precision, recall, R2, ...) is a score to maximise.
_SMALLER_IS_BETTER = ("loss", "error", "crossentropy", "hinge", "divergence", "poisson", "logcosh")
_ERROR_ABBREVIATIONS = ("mae", "mse", "mape", "msle", "rmse", "kld")


def minimised(monitor: str) -> bool:
    """Whether smaller values of ``monitor`` (``test_mae``, ``val_loss``, ``test_auc``...) are better."""
    name = monitor.split("_", 1)[1] if monitor.startswith(("test_", "val_", "train_")) else monitor
    return any(part in name for part in _SMALLER_IS_BETTER) or name in _ERROR_ABBREVIATIONS


def watched_metric(monitor: str, patience: int, metric_names: list[str], has_test: bool = True) -> str:
    """The row column early stopping watches for ``early_stopping.monitor`` and the model's metrics.

    The default (``test_accuracy``) of a model without accuracy (regression) watches ``test_loss``
    instead while patience is 0, and without a test split (``data.test_size = 0``) the validation
    split's accuracy or loss; any other monitor must name a metric the model computes, on a split that
    exists. Every rank derives it from the same config and metric names, so the config never changes.
    """
    split, name = monitor.split("_", 1)
    if split == "test" and not has_test:
        if monitor == DEFAULT_MONITOR and not patience:
            return "val_accuracy" if "accuracy" in metric_names else "val_loss"
        raise ConfigError(f"`early_stopping.monitor` watches the test split, and none is held out. Received: "
                          f"early_stopping.monitor={monitor!r} with data.test_size=0; expected a val_* monitor "
                          f"(with validation data) or data.test_size > 0")
    if name in metric_names:
        return monitor
    if monitor == DEFAULT_MONITOR and not patience:
        return "test_loss"
    available = [f"{split}_{metric}" for metric in metric_names]
    raise ConfigError(f"`early_stopping.monitor` names a metric the model does not compute. Received: "
                      f"early_stopping.monitor={monitor!r}; expected one of {available} (add the metric "
                      f"to model.metrics)")


@dataclass
class EarlyStopping:
    """Stop after ``patience`` rounds without an improvement larger than ``min_delta``.

    ``patience = 0`` never stops, but the best value and round are still kept.
    ``mode`` says whether smaller (``min``) or larger (``max``) is better;
    ``auto`` reads it from the metric's name (:func:`minimised`).
    """

    monitor: str = "test_accuracy"
    patience: int = 0
    min_delta: float = 0.0
    mode: str = "auto"
    best_value: float | None = None
    best_round: int = -1
    wait: int = 0

    @classmethod
    def from_config(cls, settings: EarlyStoppingConfig, metric_names: list[str],
                    has_test: bool = True) -> EarlyStopping:
        """From the ``early_stopping`` section, watching :func:`watched_metric` of the model's metrics."""
        monitor = watched_metric(settings.monitor, settings.patience, metric_names, has_test)
        return cls(monitor, settings.patience, settings.min_delta, settings.mode)

    @property
    def just_improved(self) -> bool:
        """Whether the round last recorded became the best."""
        return self.wait == 0 and self.best_round >= 0

    @property
    def minimise(self) -> bool:
        return self.mode == "min" or (self.mode == "auto" and minimised(self.monitor))

    def improved(self, value: float) -> bool:
        if self.best_value is None:
            return bool(np.isfinite(value))
        if self.minimise:
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def update(self, round_index: int, value: float) -> bool:
        """Record this round; return True when training should stop (:attr:`just_improved` says whether
        it became the best, whose weights the caller keeps)."""
        if self.improved(value):
            self.best_value = float(value)
            self.best_round = round_index
            self.wait = 0
            return False
        self.wait += 1
        return self.patience > 0 and self.wait >= self.patience
