"""Early stopping on a per-round metric, keeping the best weights seen."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class EarlyStopping:
    """Stop after ``patience`` rounds without an improvement larger than ``min_delta``.

    ``patience = 0`` never stops, but the best value and weights are still kept.
    A metric whose name ends in ``loss`` is minimised, anything else maximised.
    """

    monitor: str = "test_accuracy"
    patience: int = 0
    min_delta: float = 0.0
    best_value: float | None = None
    best_round: int = -1
    wait: int = 0
    best_weights: np.ndarray | None = None

    @property
    def minimise(self) -> bool:
        return self.monitor.endswith("loss")

    def improved(self, value: float) -> bool:
        if self.best_value is None:
            return bool(np.isfinite(value))
        if self.minimise:
            return value < self.best_value - self.min_delta
        return value > self.best_value + self.min_delta

    def update(self, round_index: int, value: float, weights: np.ndarray) -> bool:
        """Record this round; return True when training should stop."""
        if self.improved(value):
            self.best_value = float(value)
            self.best_round = round_index
            self.best_weights = weights.copy()
            self.wait = 0
            return False
        self.wait += 1
        return self.patience > 0 and self.wait >= self.patience
