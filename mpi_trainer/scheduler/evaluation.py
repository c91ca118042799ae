"""Scoring the global model on the scheduler: the test split every scored round (``evaluation.every``),
the validation split when monitored."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpi_trainer.comm.codec import WeightCodec
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.models import evaluate_model


class Evaluator:
    def __init__(self, cfg: Config, dataset: Dataset, model: Any, codec: WeightCodec) -> None:
        self.dataset = dataset
        self.model = model
        self.codec = codec
        self.batch = max(256, cfg.train.batch_size)
        # A validation split exists only when something asked for it (a val_* monitor, best-of, or
        # data.validation_size); under best-of the elected worker's own scores fill the val_* columns.
        monitors_validation = cfg.early_stopping.monitor.startswith("val_")
        self.scores_validation = len(dataset.x_val) > 0 and (monitors_validation or not cfg.aggregation.elects)

    def skipped(self) -> dict[str, float]:
        """The columns of a round that ``evaluation.every`` leaves unscored: none (the recorder fills
        every metric column with NaN before it adds what was measured)."""
        return {}

    def evaluate(self, weights: np.ndarray) -> tuple[dict[str, float], float]:
        """Every compiled metric of ``weights`` as ``test_<name>`` (and ``val_<name>`` when scored),
        and the seconds it took."""
        started = time.perf_counter()
        self.model.set_weights(self.codec.unflatten(weights))
        out = prefixed("test", evaluate_model(self.model, self.dataset.x_test, self.dataset.y_test, self.batch))
        if self.scores_validation:
            out.update(prefixed("val", evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val,
                                                      self.batch)))
        return out, time.perf_counter() - started


def prefixed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{split}_{name}": value for name, value in metrics.items()}
