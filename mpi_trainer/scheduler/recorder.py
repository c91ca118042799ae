"""One round, written once: what happens after a round's updates are in, whichever engine ran it.

Separation of concerns: an engine (:mod:`.synchronous` or :mod:`.stale_synchronous`)
decides when workers run and what they get, collects their reports and
produces the round's aggregated (or elected) weights. The
:class:`RoundRecorder` does everything after that: the NaN policy, the
evaluation, the ``rounds.csv`` row and ``summary.json``, early stopping,
checkpoints (:mod:`.checkpointing`), and the end of the run (final weights, summary, table). It owns
the run's counters (:class:`RunState`) and is the only writer of the run
directory. It sends nothing itself, but what it is built with may
(:class:`RoundSources`): the evaluator (under ``evaluation.where = "workers"``
it sends the workers an order, the weights and a reduction) and the
optimizer-state source a checkpoint calls (the synchronous engine asks every
worker for its state).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms import nan_guard
from mpi_trainer.algorithms.divergence import DivergenceWatch
from mpi_trainer.algorithms.early_stopping import EarlyStopping
from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.algorithms.sync_schedule import schedule_for
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import JobPlan, Report
from mpi_trainer.config import Config
from mpi_trainer.config.schema import EVERY_LOCAL_EPOCH
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import EXIT_PREEMPTED
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.preemption import preemption
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_files import (
    FINAL_WEIGHTS_NAME,
    ROUNDS_NAME,
    SUMMARY_NAME,
    RoundLog,
    round_fields,
    save_weights_atomic,
    write_json_atomic,
)
from mpi_trainer.persistence.run_record import (
    KEEPS_BEST,
    NO_CONTEXT,
    RunContext,
    RunState,
    RunSummary,
    StopReason,
    best_test_accuracy,
    final_columns,
    is_scored,
)
from mpi_trainer.reporting.observers import RunObservers
from mpi_trainer.reporting.table import format_table
from mpi_trainer.scheduler.callbacks import RoundCallbacks
from mpi_trainer.scheduler.checkpointing import RecorderCheckpoints
from mpi_trainer.scheduler.evaluation import Evaluator
from mpi_trainer.scheduler.round_row import ClosedRound, Outcome, Retry, round_row

SUMMARY_EVERY_SECONDS = 1.0  # how often summary.json is rewritten during a run (always at the end)




@dataclass
class RoundSources:
    """What the recorder gets from the engine's side, given when it is built: who scores the global model,
    where a checkpoint gets the workers' optimizer states (by default none: checkpoints hold none),
    whether the engine merges each update as it arrives (then no round aggregate is stepped from), the
    rounds.csv columns only this engine fills (after every engine's), and the summary.json values only
    it knows (L-BFGS's function evaluations, say), asked for each time the summary is written."""

    evaluator: Evaluator
    optimizer_states: Callable[[], dict[int, np.ndarray]] = dict
    merges_each_update: bool = False
    extra_columns: tuple[str, ...] = ()
    summary_values: Callable[[], dict[str, Any]] = dict


class RoundRecorder(RecorderCheckpoints):
    def __init__(self, cfg: Config, dataset: Dataset, model: Any, codec: WeightCodec, plan: JobPlan,
                 run_dir: Path, transport_stats: Any, hosts: list[str], sources: RoundSources,
                 resume: ResumeState | None = None, context: RunContext = NO_CONTEXT) -> None:
        self.cfg, self.dataset, self.model, self.codec, self.plan = cfg, dataset, model, codec, plan
        self.run_dir = run_dir
        self.transport_stats = transport_stats  # read-only: the scheduler's wait counters
        self.log = get_logger()
        self.evaluator, self.optimizer_states = sources.evaluator, sources.optimizer_states
        self.summary_values = sources.summary_values
        self.early = EarlyStopping.from_config(cfg.early_stopping, plan.metric_names, len(dataset.y_test) > 0)
        self.metric_names = plan.metric_names
        self.schedule = schedule_for(cfg.train, plan.block_bounds)  # each round's local steps (post-local SGD)
        self.state = RunState()
        self.divergence = DivergenceWatch(0 if cfg.train.divergence == "off" else cfg.train.divergence_rounds,
                                          dataset.num_outputs if dataset.classes else None)
        self.started = time.perf_counter()
        self.start_round = 0
        self.discarded_bytes = 0  # traffic of rounds rolled back, counted with the next recorded round
        self.initial_weights = codec.flatten(model.get_weights())
        self.kept_weights: np.ndarray | None = None  # the weights the run ends with, once finished
        self.placement = [dict(rank) for rank in context.placement]  # host, backend and device of every rank
        self.callbacks = (None if context.callbacks is None else  # Keras callbacks from mpi_trainer.fit
                          RoundCallbacks(list(context.callbacks), model, cfg.train.epochs, self.metric_names,
                                         context.initial_epoch))
        # the learning rate a callback set on the scheduler's optimizer, for the workers' next round
        self.callback_rate: float | None = None
        self.summary_written = -math.inf
        # the step from each round's aggregate to the next global model, over the trainable weights only;
        # its state lives here only
        self.outer = OuterOptimizer(OuterSettings.from_config(cfg, len(plan.block_bounds), sources.merges_each_update),
                                    codec.trainable_spans(model))
        self.lost_workers: list[dict[str, Any]] = []  # fault.survive: who was lost, on which host, when
        self.fingerprint = dict(context.fingerprint)  # the model's and data's, kept in checkpoints
        self.last_checkpoint = time.monotonic()  # checkpoint.every_seconds counts from here
        self.last_checkpoint_round = -1
        self.due: tuple[int, bool] | None = None  # (round, whether it checkpoints): decided once a round
        self.preempt_reported = False  # a worker's report said it was signalled
        if resume is not None:
            self.restore(resume)
        self.round_log = RoundLog(run_dir / ROUNDS_NAME, round_fields(self.metric_names) + list(sources.extra_columns))
        # progress, TensorBoard and the timeline: what rank 0 shows of each round besides rounds.csv
        self.observers = RunObservers(cfg, run_dir, self.start_round, hosts, self.state.rounds)

    def begin(self) -> None:
        """Before the first round: the callbacks' ``on_train_begin``."""
        if self.callbacks is not None:
            self.callbacks.begin(self.start_round)
            self.callback_rate = self.callbacks.changed_learning_rate()  # e.g. a scheduler's rate for round 0

    def restore(self, resume: ResumeState) -> None:
        """Carry on from a checkpoint: counters, early-stopping state, and the time and bytes spent so far."""
        self.early.best_value, self.early.best_round = resume.best_value, resume.best_round
        self.early.wait, self.early.best_weights = resume.wait, resume.best_weights
        self.state = RunState(rounds=resume.rounds, traffic_bytes=resume.traffic_bytes, steps=resume.steps,
                              lr_scale=resume.lr_scale, wall_offset=resume.wall_seconds,
                              rollbacks=resume.rollbacks)
        self.start_round = resume.next_round
        self.divergence.start_from([row for row in resume.rounds if is_scored(row)])
        self.outer.load_state(resume.outer_state, resume.weights.size)
        if self.outer.active and not self.outer.state:
            self.log.info("the checkpoint holds no %s outer optimizer state: it starts fresh after round %d",
                          self.outer.settings.name, resume.next_round - 1)

    @property
    def workers(self) -> int:
        return len(self.plan.block_bounds)

    @property
    def learning_rate(self) -> float:
        return self.cfg.model.learning_rate * self.state.lr_scale

    def elapsed(self) -> float:
        """Wall seconds of the whole run, including the attempts before a resume."""
        return self.state.wall_offset + time.perf_counter() - self.started

    def steps_exhausted(self) -> bool:
        return 0 < self.cfg.train.max_steps <= self.state.steps

    def count_bytes(self, nbytes: int) -> None:
        """Traffic outside any round's row (set-up, release, a discarded round): in the run's total only."""
        self.state.traffic_bytes += nbytes

    # -- the NaN policy -------------------------------------------------------
    def non_finite_cause(self, reports: list[Report], weights: np.ndarray) -> str | None:
        outcomes = [nan_guard.WorkerOutcome(r.rank, r.train_loss, r.weights_finite) for r in reports]
        return nan_guard.non_finite_cause(outcomes, weights)

    def on_non_finite(self, round_index: int, cause: str, before: np.ndarray,
                      received: int) -> tuple[Outcome, np.ndarray]:
        """Apply ``train.nan_policy``: (NAN, the weights before the round) or (RETRY, the weights to rerun from)."""
        self.discarded_bytes += received
        policy = self.cfg.train.nan_policy
        if nan_guard.decide(policy, self.state.consecutive_rollbacks) == nan_guard.STOP:
            self.log.error("round %d: %s; stopping (train.nan_policy=%r, %d rollbacks in a row), keeping "
                           "the best weights", round_index, cause, policy, self.state.consecutive_rollbacks)
            return StopReason.NAN, before
        weights, checkpoint_round = self.last_good_weights()
        old_rate = self.learning_rate
        self.state.lr_scale /= 2
        self.state.consecutive_rollbacks += 1
        self.state.rollbacks.append({"round": round_index, "checkpoint_round": checkpoint_round,
                                     "learning_rate": self.learning_rate, "cause": cause})
        source = (f"the checkpoint of round {checkpoint_round}" if checkpoint_round >= 0
                  else "the initial weights")
        self.log.warning("round %d: %s; rolled back to %s, learning rate %g -> %g, optimizer state reset; "
                         "running round %d again", round_index, cause, source, old_rate, self.learning_rate,
                         round_index)
        return Retry.ROUND, weights

    # -- closing a round --------------------------------------------------------
    def close_round(self, closed: ClosedRound, weights: np.ndarray,
                    timing: Callable[[float], dict[str, Any]]) -> StopReason | None:
        """Evaluate, record, check early stopping and checkpoint; returns a stop reason or None.

        ``timing(ended)`` gives the engine's own columns (wall, communication,
        idle time, block sizes) once the evaluation has ended at ``ended``.
        """
        self.state.consecutive_rollbacks = 0
        self.preempt_reported = self.preempt_reported or any(r.preempt for r in closed.reports)
        scored = self.evaluation_due(closed.index)
        evaluation, eval_seconds = (self.evaluator.evaluate(weights, closed.index) if scored
                                    else (self.evaluator.skipped(), 0.0))
        if scored:
            self.observers.span("evaluate", closed.index, time.perf_counter() - eval_seconds)
        row = round_row(closed, evaluation, self.metric_names, self.workers, self.schedule.steps(closed.index),
                        self.discarded_bytes)
        self.discarded_bytes = 0
        row.update(eval_seconds=eval_seconds, **timing(time.perf_counter()))
        self.record(row)
        # early stopping counts scored rounds only: an unscored round has nothing to compare
        stop = scored and self.early.update(closed.index, row[self.early.monitor], weights)
        self.maybe_checkpoint(closed.index, weights)
        if stop:
            return StopReason.EARLY_STOPPING
        if self.diverged(closed.index, row):
            return StopReason.DIVERGED
        if self.run_callbacks(closed.index, row, weights, scored):
            return StopReason.CALLBACK
        if self.preempting() and closed.index + 1 < self.cfg.train.epochs and not self.steps_exhausted():
            return StopReason.PREEMPTED
        return None

    def diverged(self, round_index: int, row: dict[str, Any]) -> bool:
        """Watch for a finite divergence (``train.divergence``); True when the run is to stop for it."""
        cause = self.divergence.update(row) if is_scored(row) else None
        if cause is None:
            return False
        stop = self.cfg.train.divergence == "stop"
        self.state.divergence = {"round": round_index, "cause": cause, "action": "stopped" if stop else "warned"}
        self.log.warning("round %d: the run is diverging: %s; %s", round_index, cause,
                         "stopping and keeping the best weights (train.divergence='stop')" if stop else
                         "training goes on (train.divergence='warn'; 'stop' ends the run here, keeping the best "
                         "weights; lower model.learning_rate to avoid it)")
        return stop

    def run_callbacks(self, round_index: int, row: dict[str, Any], weights: np.ndarray, scored: bool) -> bool:
        """The Keras callbacks' ``on_epoch_end`` with the round's weights in the model; True when one asked to
        stop. A learning rate they set goes to the workers with the next round."""
        if self.callbacks is None:
            return False
        if not scored:  # a scored round left its weights in the model already
            self.model.set_weights(self.codec.unflatten(weights))
        stop = self.callbacks.round_end(round_index, row)
        rate = self.callbacks.changed_learning_rate()
        if rate is not None:
            self.log.info("round %d: a callback set the learning rate to %g for the next round", round_index, rate)
            self.callback_rate = rate
        if stop:
            self.log.info("round %d: a callback set model.stop_training; stopping", round_index)
        return stop

    def preempting(self) -> bool:
        """A preemption signal reached this rank or (by its report) a worker."""
        return self.preempt_reported or preemption().requested

    def evaluation_due(self, round_index: int) -> bool:
        """Whether this round is scored: every ``evaluation.every``-th, the last, and any checkpointed one.

        ``evaluation.every = 0`` (the default) scores once per local epoch, as ``fit`` does: every
        round when a round is a local epoch, else the round that completes one (of the largest
        block). During a sync warm-up a round is a step or a few, so there ``evaluation.every``
        counts local epochs (the warm-up round that completes one) instead of rounds.
        """
        every = self.cfg.evaluation.every
        last = round_index + 1 >= self.cfg.train.epochs or self.steps_exhausted()
        if every == EVERY_LOCAL_EPOCH:
            due = self.schedule.closes_epoch(round_index)
        elif self.schedule.in_warmup(round_index):
            epochs = (round_index + 1) // self.schedule.rounds_per_warmup_epoch
            due = self.schedule.closes_warmup_epoch(round_index) and epochs % every == 0
        else:
            due = (round_index - self.schedule.warmup_rounds + 1) % every == 0
        return due or last or self.checkpoint_due(round_index)

    def record(self, row: dict[str, Any]) -> None:
        self.state.traffic_bytes += row["bytes"]
        row["elapsed_seconds"] = self.elapsed()
        row["steps"] = self.state.steps
        self.state.rounds.append(row)
        self.round_log.write(row)
        self.observers.write_round(row)  # also the round's line in the log
        # summary.json is rewritten atomically (with two fsyncs, about 6 ms), so during the run at
        # most once a second: at train.sync_every = 1 once per round would slow every step
        if time.perf_counter() - self.summary_written >= SUMMARY_EVERY_SECONDS:
            write_json_atomic(self.run_dir / SUMMARY_NAME, self.summary())
            self.summary_written = time.perf_counter()

    # -- the end ----------------------------------------------------------------------
    def final_weights(self, weights: np.ndarray) -> tuple[np.ndarray, dict[str, Any] | None]:
        """The weights kept and their round: the best ones after an early or NaN stop, else the last."""
        rounds = self.state.rounds
        if self.state.stop_reason in KEEPS_BEST and self.early.best_weights is not None:
            return self.early.best_weights, next(r for r in rounds if int(r["round"]) == self.early.best_round)
        return weights, (rounds[-1] if rounds else None)

    def finish(self, weights: np.ndarray, states: dict[int, np.ndarray]) -> dict[str, Any]:
        """Final weights, final checkpoint, summary and the per-round table; returns the summary."""
        kept, final = self.final_weights(weights)
        self.kept_weights = kept
        self.model.set_weights(self.codec.unflatten(kept))
        preempted = self.state.stop_reason == StopReason.PREEMPTED
        if not preempted:  # a preempted run has no final weights yet; its checkpoint carries it on
            save_weights_atomic(self.model, self.run_dir / FINAL_WEIGHTS_NAME)
        if self.needs_final_checkpoint():
            self.checkpoint(int(self.state.rounds[-1]["round"]), kept, states)
        summary = self.summary(final)
        write_json_atomic(self.run_dir / SUMMARY_NAME, summary)
        if preempted:
            self.log.warning("preempted (%s): checkpoint written after round %s; exiting with status %d. Run "
                             "the same command again to resume", preemption().signal_name or "a worker's signal",
                             summary["final_round"], EXIT_PREEMPTED)
            return summary
        if self.callbacks is not None:
            self.callbacks.end()  # after the files: a callback may change the model's weights (restore best)
            self.keep_callback_weights()
        if self.state.rounds:
            self.log.info("per-round results:\n%s", format_table(self.state.rounds))
        accuracy = summary["final_test_accuracy"]
        self.log.info("done: %s after %d rounds, final test accuracy %s, %.1f s, %.2f MB sent; run "
                      "directory %s", summary["stop_reason"], summary["rounds_completed"],
                      "n/a" if accuracy is None else f"{accuracy:.4f}", summary["wall_seconds"],
                      summary["traffic_bytes"] / 1e6, self.run_dir)
        return summary

    def keep_callback_weights(self) -> None:
        """A callback that put other weights in the model at the end (``EarlyStopping``'s
        ``restore_best_weights``): those are the run's final weights, in the model and on disk."""
        held = self.codec.flatten(self.model.get_weights())
        if self.kept_weights is not None and np.array_equal(held, self.kept_weights):
            return
        self.kept_weights = held
        save_weights_atomic(self.model, self.run_dir / FINAL_WEIGHTS_NAME)
        self.log.info("a callback restored other weights at the end of training; %s holds them",
                      FINAL_WEIGHTS_NAME)

    def summary(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
        rounds = self.state.rounds
        final = final or (rounds[-1] if rounds else {})
        stats = self.transport_stats
        values = dict(
            rounds_completed=len(rounds), **final_columns(final, self.metric_names),
            best_test_accuracy=best_test_accuracy(rounds), metrics=self.metric_names,
            monitor=self.early.monitor, best_value=self.early.best_value, best_round=self.early.best_round,
            wall_seconds=self.elapsed(), steps=self.state.steps, learning_rate=self.learning_rate,
            rollbacks=self.state.rollbacks,
            resumed_after_round=self.start_round - 1 if self.start_round else None,
            traffic_bytes=self.state.traffic_bytes, checkpoint_bytes=self.state.checkpoint_bytes,
            model_bytes=self.codec.nbytes, stop_reason=self.state.stop_reason, workers=self.workers,
            optimizer=self.cfg.model.optimizer, aggregation=self.cfg.aggregation.method,
            outer_optimizer=self.outer.settings.name, ssp=self.cfg.aggregation.ssp,
            scheduler_wait_seconds=stats.wait_wall_seconds, scheduler_wait_cpu_seconds=stats.wait_cpu_seconds,
            dataset=self.dataset.describe(), placement=self.placement, lost_workers=self.lost_workers,
            divergence=self.state.divergence,
        )
        return RunSummary(**{**values, **self.summary_values()}).as_dict()

    def close(self) -> None:
        self.round_log.close()
        self.observers.close()
