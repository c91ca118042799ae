"""A worker's local training: one local epoch of its block (or k steps of a walk through it), and the
scores it reports.

:class:`LocalTraining` is the collaborator a :class:`~mpi_trainer.worker.worker.Worker` holds: it
owns the local model and its flat-weights codec, the walk and shuffle through the block, the step
timer and the round's rows (read from the worker's data placement). Handed the global weights, it
trains and returns a report and the trained weights; it never sends anything.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.algorithms.sync_schedule import schedule_for
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.messages import JobPlan, Report
from mpi_trainer.config import Config
from mpi_trainer.data.placement import WorkerData
from mpi_trainer.data.sources import Dataset
from mpi_trainer.data.walk import BlockWalk
from mpi_trainer.logs import get_logger
from mpi_trainer.models import evaluate_model
from mpi_trainer.persistence.resume import worker_seed
from mpi_trainer.reporting.progress import with_batch_progress
from mpi_trainer.reporting.timeline import PhaseLog
from mpi_trainer.worker.step_timer import StepTimer

if TYPE_CHECKING:
    from mpi_trainer.data.adapters import BlockFeed


class LocalTraining:
    """Training and scoring on this worker's block, from the global weights it is handed.

    ``model``: the worker's compiled Keras model (built). ``data``: the worker's rows (its block, and
    each round's draw). ``phases``: the worker's timeline, which the training adds its phases to.
    ``slowdown`` (a Keras callback, or None) and ``nan_round`` are the test hooks that slow this
    rank's steps and poison its weights once.
    """

    def __init__(self, model: Any, data: WorkerData, dataset: Dataset | None, cfg: Config, plan: JobPlan,
                 phases: PhaseLog, slowdown: Any | None = None, nan_round: int | None = None) -> None:
        self.model = model
        self.codec = WeightCodec.from_weights(model.get_weights())
        self.finalized = layers_with_state(model)  # e.g. an adapted Normalization: its stats are weights
        self.data, self.dataset, self.cfg, self.phases = data, dataset, cfg, phases
        self.schedule = schedule_for(cfg.train, plan.block_bounds)  # steps per round, as the scheduler has it
        self.step_timer = StepTimer(cfg.train.batch_size)  # the speed that rebalancing cuts blocks by
        self.shuffle_rng = np.random.default_rng(worker_seed(cfg.train.seed, data.rank, plan.start_round))
        self.walk = BlockWalk(self.shuffle_rng, cfg.train.shuffle)  # k-step rounds; a resumed run starts afresh
        self.slowdown = slowdown
        self.nan_round = nan_round  # the round NaN is injected in (None: never, cleared once done)
        self.log = get_logger()

    @property
    def rank(self) -> int:
        """This worker's rank now (a shrink under ``fault.survive`` renumbers it)."""
        return self.data.rank

    def take_weights(self, flat: np.ndarray) -> None:
        """Load flat weights into the local model, and let layers that derive tensors from their weights
        (an adapted ``Normalization``'s mean and variance) recompute them, as Keras does on loading."""
        self.codec.load(self.model, flat)
        if self.finalized:  # the scheduler's first weights carry the stats; they never change after
            finalize_layers(self.finalized, self.model)
            self.finalized.clear()

    def train_and_report(self, round_index: int, start: np.ndarray,
                         max_steps: int | None = None) -> tuple[Report, np.ndarray]:
        """This round's training from the global weights ``start`` (one local epoch, or k steps); report and
        new weights (the report's ``preempt`` is the worker's to set). The new weights are flattened into
        ``start``'s buffer: once the model holds the start, a worker keeps one flat copy of its weights."""
        k = self.schedule.steps(round_index)
        # k-step rounds walk the fixed block (the config refuses data increment), augmenting per batch
        feed = None if k else self.data.for_round(round_index)
        learning_rate = current_learning_rate(self.model.optimizer)
        self.take_weights(start)
        metrics, train_seconds, steps = self.train_steps(k, max_steps) if feed is None \
            else self.train_once(feed, max_steps)
        self.phases.add("train", round_index, time.time() - train_seconds)
        local = self.codec.flatten(self.model.weights, out=start)
        self.maybe_inject_nan(round_index, local)
        loss = metrics.get("loss", 0.0 if not steps else math.nan)
        units = self.data.units(self.data.fixed_x) if feed is None else feed.units
        report = Report(self.rank, round_index, units, loss, metrics.get("accuracy", math.nan),
                        train_seconds, steps=steps, weights_finite=bool(np.isfinite(local).all()),
                        train_metrics=metrics, learning_rate=learning_rate)
        if not k and steps:  # k-step rounds are not timed: rebalancing is refused with them
            report.step_rate, report.timed_steps = self.step_timer.finish_round()
        return report, local

    def train_once(self, feed: BlockFeed, max_steps: int | None = None) -> tuple[dict[str, Any], float, int]:
        """One local epoch over the round's feed (or ``max_steps`` batches of it); metrics, seconds, steps."""
        batch = self.cfg.train.batch_size
        steps = feed.steps(batch) if max_steps is None else min(max_steps, feed.steps(batch))
        if steps == 0:
            return {}, 0.0, 0
        return self.fit_round(feed.fit_input(batch, self.shuffle_rng, max_steps), steps, feed.samples(batch, steps),
                              feed.class_weight)

    def fit_round(self, arguments: dict[str, Any], steps: int, samples: int,
                  class_weight: dict[int, float] | None) -> tuple[dict[str, Any], float, int]:
        """``model.fit`` for one local epoch of ``steps`` batches (of ``samples`` rows), with the
        ``class_weight`` Keras is to apply to them; metrics, seconds, steps."""
        started = time.perf_counter()
        callbacks = [self.slowdown] if self.slowdown is not None else None
        callbacks = with_batch_progress(callbacks, self.cfg.log.verbosity, steps)
        self.step_timer.start_round(samples)
        callbacks = [*(callbacks or []), self.step_timer.callback()]  # last: it times the slowdown's pause too
        history = self.model.fit(**arguments, class_weight=class_weight, epochs=1, verbose=0, callbacks=callbacks)
        metrics = {k: float(v[-1]) for k, v in history.history.items()}
        return metrics, time.perf_counter() - started, steps

    def train_steps(self, k: int, max_steps: int | None = None) -> tuple[dict[str, Any], float, int]:
        """``k`` steps, the round's share of the sync schedule (fewer under a ``max_steps`` budget);
        metrics, seconds, steps.

        ``train_on_batch`` runs the model's compiled train function on one batch: no
        input pipeline is built per round, and the optimizer state carries over.
        """
        steps = k if max_steps is None else min(max_steps, k)
        totals: dict[str, float] = {}
        seen = 0
        started = time.perf_counter()
        for _ in range(steps):
            rows = self.step_rows()
            x, y = self.data.batch(rows)
            for key, value in self.train_step(x, y, self.data.sample_weights(y, rows)).items():
                totals[key] = totals.get(key, 0.0) + float(value) * len(rows)
            seen += len(rows)
        # the round's metrics are sample-weighted means over its steps, as fit's are over an epoch
        metrics = {key: total / seen for key, total in totals.items()}
        return metrics, time.perf_counter() - started, steps

    def step_rows(self) -> np.ndarray:
        """Indices into the block of the next step's batch."""
        return self.walk.next_rows(self.data.units(self.data.fixed_x), self.cfg.train.batch_size)

    def train_step(self, x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> dict[str, Any]:
        return one_step(self.model, x, y, self.slowdown, weights)

    def maybe_inject_nan(self, round_index: int, local: np.ndarray) -> None:
        """Test hook (nan_rank / nan_round): poison this rank's weights once."""
        if self.nan_round == round_index:
            self.log.warning("test hook: injecting NaN into the weights of round %d", round_index)
            local[:] = np.nan
            self.nan_round = None

    def score(self, report: Report) -> None:
        """Best-of election: score this round's weights on the shared validation split."""
        if self.dataset is None:
            raise RuntimeError("best-of scoring needs the validation split, and this worker holds no dataset")
        started = time.perf_counter()
        result = evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val,
                                max(256, self.cfg.train.batch_size))
        report.val_loss, report.val_accuracy = result["loss"], result.get("accuracy", math.nan)
        report.val_metrics = result
        report.eval_seconds = time.perf_counter() - started
        self.phases.add("evaluate", report.round, time.time() - report.eval_seconds)


def layers_with_state(model: Any) -> list[Any]:
    """The layers, nested ones included, that override ``finalize_state`` (computed from their weights)."""
    found, stack = [], [model]
    while stack:
        layer = stack.pop()
        stack.extend(getattr(layer, "layers", None) or [])
        if layer is not model and callable(getattr(layer, "finalize_state", None)):
            found.append(layer)
    return found


def finalize_layers(layers: list[Any], model: Any) -> None:
    """Recompute the layers' derived tensors; the compiled functions captured the old ones, so they go too."""
    for layer in layers:
        layer.finalize_state()
    model.train_function = model.test_function = model.predict_function = None


def current_learning_rate(optimizer: Any) -> float:
    """The learning rate the optimizer's next step takes (a schedule's value at its step count)."""
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (AttributeError, TypeError, ValueError):
        return float("nan")


def one_step(model: Any, x: np.ndarray, y: np.ndarray, slowdown: Any | None,
             weights: np.ndarray | None = None) -> dict[str, Any]:
    """One ``train_on_batch``, paused by the test hooks' slowdown callback when there is one."""
    if slowdown is None:
        logs: dict[str, Any] = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
        return logs
    slowdown.on_train_batch_begin(0)
    logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
    slowdown.on_train_batch_end(0)
    return logs
