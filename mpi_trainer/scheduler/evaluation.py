"""Scoring the global model: the test split every scored round (``evaluation.every``), the validation
split when monitored; on the scheduler, or (``evaluation.where = "workers"``) by the workers, each on
its shard, with the metrics' summed state reduced to the scheduler."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import EvaluateOrder, SchedulerLink
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.logs import get_logger
from mpi_trainer.models import evaluate_model, metric_state, metrics_from_flat
from mpi_trainer.scheduler.watchdog import Watchdog


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
        self.scores_test = len(dataset.y_test) > 0  # data.test_size = 0 holds no test split out
        self.loaded_version = -1  # the version of the global weights last loaded into the model (-1: none)

    def skipped(self) -> dict[str, float]:
        """The columns of a round that ``evaluation.every`` leaves unscored: none (the recorder fills
        every metric column with NaN before it adds what was measured)."""
        return {}

    def holds(self, version: int) -> bool:
        """Whether the workers already hold the global weights at ``version`` (the engine's count of
        changes to them): never, when the scheduler scores them itself."""
        return False

    def evaluate(self, weights: np.ndarray, round_index: int = -1, version: int = -1) -> tuple[dict[str, float], float]:
        """Every compiled metric of ``weights`` as ``test_<name>`` (and ``val_<name>`` when scored),
        and the seconds it took. ``version``: the engine's count of changes to its global weights."""
        started = time.perf_counter()
        # Each variable whole (WeightCodec.load): writing a variable in blocks of rows instead (scatter_update
        # or a strided-slice assign) switches it to copy-on-read, and every later read, each training or
        # evaluation step's, then copies the whole variable, which costs more memory and time than it saves.
        self.codec.load(self.model, weights)
        self.loaded_version = version
        out: dict[str, float] = {}
        if self.scores_test:
            out = prefixed("test", evaluate_model(self.model, self.dataset.x_test, self.dataset.y_test, self.batch))
        if self.scores_validation:
            out.update(prefixed("val", evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val,
                                                      self.batch)))
        return out, time.perf_counter() - started


class WorkerEvaluator(Evaluator):
    """``evaluation.where = "workers"``: every worker scores its shard of the global weights.

    Between synchronous rounds the workers would wait while the scheduler scores
    alone; instead the weights are broadcast (in float32: the scores are the
    global model's, whatever the wire format), each worker sums its metrics'
    state over its shard, and one float64 sum-reduction gives the exact state of
    the whole split. The workers keep the weights, so the next round starts
    without another broadcast (:meth:`holds`).

    It sends: an EvaluateOrder to every worker, the broadcast, and the reduction.
    The engine names the version of its global weights it hands over (its count of
    changes to them); the workers hold the weights of the version they scored last,
    until it changes.

    Under ``fault.survive``, once a worker is lost its shard has no other reader
    (each worker read only its own part of the test split), so the scheduler,
    which read the whole split, scores every later round itself: the scores stay
    exact, and every round after the loss starts with a broadcast of the weights.
    """

    def __init__(self, cfg: Config, dataset: Dataset, model: Any, codec: WeightCodec, link: SchedulerLink,
                 watchdog: Watchdog) -> None:
        super().__init__(cfg, dataset, model, codec)
        self.link, self.watchdog = link, watchdog
        self.state_size = sum(int(np.size(part)) for part in metric_state(model))
        self.held_version: int | None = None  # the version the workers scored last (None: none yet)
        self.scorers = len(link.workers)  # the workers that hold a shard; fewer after a loss
        self.moved = False  # scoring moved to the scheduler after a loss (said once in the log)
        get_logger().info("evaluation.where = workers: each of %d workers scores its part of the %d test%s rows",
                          len(link.workers), len(dataset.y_test),
                          f" and {len(dataset.y_val)} validation" if self.scores_validation else "")

    @property
    def on_workers(self) -> bool:
        """False once the job lost a worker (``fault.survive``): its shard would go unscored."""
        return len(self.link.workers) == self.scorers

    def holds(self, version: int) -> bool:
        """True when the workers' last EvaluateOrder broadcast carried ``version`` of the global weights."""
        return self.on_workers and self.held_version == version

    def evaluate(self, weights: np.ndarray, round_index: int = -1, version: int = -1) -> tuple[dict[str, float], float]:
        if not self.on_workers:
            if not self.moved:
                get_logger().warning("round %d: a worker and its test shard were lost; the scheduler scores the "
                                     "global model from now on", round_index)
                self.moved = True
            return super().evaluate(weights, round_index, version)
        started = time.perf_counter()
        order = EvaluateOrder(round_index, self.scores_validation)
        summed = np.zeros(self.state_size * (2 if self.scores_validation else 1), dtype=np.float64)
        what = f"score round {round_index}"
        try:
            for worker in self.link.workers:
                self.link.send_order(worker, order)
            # the broadcast's arrival messages name a worker that stopped before scoring
            self.link.broadcast_weights(weights, self.watchdog.timeout)
            self.link.reduce_metric_state(summed, self.watchdog.timeout)
        except TimeoutError as exc:
            raise self.watchdog.timed_out(what, exc, self.link.workers) from None
        self.held_version = version
        out = prefixed("test", metrics_from_flat(self.model, summed[:self.state_size])) if self.scores_test else {}
        if self.scores_validation:
            out.update(prefixed("val", metrics_from_flat(self.model, summed[self.state_size:])))
        return out, time.perf_counter() - started


def make_evaluator(cfg: Config, dataset: Dataset, model: Any, codec: WeightCodec, link: SchedulerLink,
                   watchdog: Watchdog) -> Evaluator:
    """The evaluator ``evaluation.where`` asks for: the scheduler's own, or the workers' (:class:`WorkerEvaluator`)."""
    if cfg.evaluation.on_workers:
        return WorkerEvaluator(cfg, dataset, model, codec, link, watchdog)
    return Evaluator(cfg, dataset, model, codec)


def prefixed(split: str, metrics: dict[str, float]) -> dict[str, float]:
    return {f"{split}_{name}": value for name, value in metrics.items()}
