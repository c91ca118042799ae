"""Scoring the global model on the scheduler: the test split every scored round (``evaluation.every``),
the validation split when monitored."""

from __future__ import annotations

import math
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
        self.scores_validation = cfg.early_stopping.monitor.startswith("val_") and len(dataset.x_val) > 0

    def skipped(self) -> dict[str, float]:
        """The columns of a round that ``evaluation.every`` leaves unscored."""
        out = {"test_loss": math.nan, "test_accuracy": math.nan}
        if self.scores_validation:
            out.update(val_loss=math.nan, val_accuracy=math.nan)
        return out

    def evaluate(self, weights: np.ndarray) -> tuple[dict[str, float], float]:
        """``test_*`` (and ``val_*`` when early stopping watches them) of ``weights``, and the seconds it took."""
        started = time.perf_counter()
        self.model.set_weights(self.codec.unflatten(weights))
        result = evaluate_model(self.model, self.dataset.x_test, self.dataset.y_test, self.batch)
        out = {"test_loss": result["loss"], "test_accuracy": result["accuracy"]}
        if self.scores_validation:
            result = evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val, self.batch)
            out.update(val_loss=float(result["loss"]), val_accuracy=float(result["accuracy"]))
        return out, time.perf_counter() - started
