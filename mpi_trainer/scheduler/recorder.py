"""The run's writer: what a finished round leaves behind, whichever engine ran it.

Separation of concerns: an engine (:mod:`.synchronous`, :mod:`.stale_synchronous` or
:mod:`.lbfgs`) owns a round: it decides when workers run and what they get, collects
their reports, combines their weights, takes the outer optimizer's step, follows the
sync schedule, applies the NaN policy and scores the global model. It hands the
:class:`RoundRecorder` a :class:`~mpi_trainer.scheduler.round_row.FinishedRound` (the
round's row and weights) and, when :meth:`RoundRecorder.checkpoint_due` says so, an
:class:`~mpi_trainer.scheduler.round_row.EngineState` (the workers' optimizer states
in it are read one at a time as the checkpoint is written). The recorder is a sink: it
writes ``rounds.csv``, ``summary.json``, the checkpoints, TensorBoard and the timeline,
runs early stopping, the divergence watch and the Keras callbacks on the round's logs,
and says whether the run is to stop. It owns the run's counters (:class:`RunState`), is
the only writer of the run directory, sends nothing and never calls an engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mpi_trainer.algorithms.divergence import DivergenceWatch
from mpi_trainer.algorithms.early_stopping import EarlyStopping
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.messages import JobPlan
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import EXIT_PREEMPTED
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.checkpoint import CheckpointArray, open_checkpoint, save_checkpoint
from mpi_trainer.persistence.optimizer_state import ARRAY_PREFIX
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.persistence.resume import ResumeState, left_on_disk, worker_seed
from mpi_trainer.persistence.run_files import (
    CHECKPOINT_NAME,
    FINAL_WEIGHTS_NAME,
    ROUNDS_NAME,
    SUMMARY_NAME,
    RoundLog,
    backup_path,
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
from mpi_trainer.persistence.spill import SpilledArray
from mpi_trainer.reporting.observers import RunObservers
from mpi_trainer.reporting.table import format_table
from mpi_trainer.scheduler.callbacks import RoundCallbacks
from mpi_trainer.scheduler.round_row import EngineState, FinishedRound

SUMMARY_EVERY_SECONDS = 1.0  # how often summary.json is rewritten during a run (always at the end)


class WaitCounters(Protocol):
    """The scheduler's own waiting, as its transport counts it (read for summary.json)."""

    @property
    def wait_wall_seconds(self) -> float: ...

    @property
    def wait_cpu_seconds(self) -> float: ...


class RoundRecorder:
    """The run directory's one writer, for every engine; see the module's docstring.

    ``outer_optimizer``: the outer optimizer in effect, named in summary.json; ``extra_columns``: the
    rounds.csv columns only this engine fills (after every engine's).
    """

    def __init__(self, cfg: Config, dataset: Dataset, model: Any, codec: WeightCodec, plan: JobPlan,
                 run_dir: Path, counters: WaitCounters, hosts: list[str], resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT, *, outer_optimizer: str = "none",
                 extra_columns: Sequence[str] = ()) -> None:
        self.cfg, self.dataset, self.model, self.codec, self.plan = cfg, dataset, model, codec, plan
        self.run_dir = run_dir
        self.counters = counters  # read-only: the scheduler's wait counters
        self.outer_optimizer = outer_optimizer
        self.log = get_logger()
        self.metric_names: list[str] = list(plan.metric_names)
        self.early = EarlyStopping.from_config(cfg.early_stopping, self.metric_names, len(dataset.y_test) > 0)
        self.state = RunState()
        self.divergence = DivergenceWatch(cfg.train.divergence_rounds if cfg.train.watches_divergence else 0,
                                          dataset.num_outputs if dataset.classes else None)
        self.started = time.perf_counter()
        self.start_round = 0
        self.kept_weights: np.ndarray | None = None  # the weights the run ends with, once finished
        self.best: SpilledArray | None = None  # the best scored round's weights (what an early or NaN stop keeps)
        self.placement = [dict(rank) for rank in context.placement]  # host, backend and device of every rank
        self.callbacks = (None if context.callbacks is None else  # Keras callbacks from mpi_trainer.fit
                          RoundCallbacks(list(context.callbacks), model, cfg.train.epochs, self.metric_names,
                                         context.initial_epoch))
        # the learning rate a callback set on the scheduler's optimizer, for the workers' next round
        self.callback_rate: float | None = None
        self.summary_written = -math.inf
        self.summary_values: dict[str, Any] = {}  # summary.json's values only one engine knows
        self.lost_workers: list[dict[str, Any]] = []  # fault.survive: who was lost, on which host, when
        self.fingerprint = dict(context.fingerprint)  # the model's and data's, kept in checkpoints
        # this rank's preemption signal, as the job's handlers note it (a run without them: never signalled)
        self.preemption = context.preemption or Preemption()
        self.last_checkpoint = time.monotonic()  # checkpoint.every_seconds counts from here
        self.last_checkpoint_round = -1
        self.due: tuple[int, bool] | None = None  # (round, whether it checkpoints): decided once a round
        self.preempt_reported = False  # a worker's report said it was signalled
        if resume is not None:
            self.restore(resume)
        self.round_log = RoundLog(run_dir / ROUNDS_NAME, round_fields(self.metric_names) + list(extra_columns))
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
        self.early.wait = resume.wait
        if resume.best_weights is not None:
            self.best = SpilledArray(resume.best_weights)
        self.state = RunState(rounds=resume.rounds, traffic_bytes=resume.traffic_bytes, steps=resume.steps,
                              lr_scale=resume.lr_scale, wall_offset=resume.wall_seconds,
                              rollbacks=resume.rollbacks)
        self.start_round = resume.next_round
        self.divergence.start_from([row for row in resume.rounds if is_scored(row)])

    @property
    def workers(self) -> int:
        return len(self.plan.block_bounds)

    @property
    def learning_rate(self) -> float:
        return self.cfg.model.learning_rate * self.state.lr_scale

    @property
    def last_round(self) -> int:
        """The last round recorded (-1 before one)."""
        return int(self.state.rounds[-1]["round"]) if self.state.rounds else -1

    def elapsed(self) -> float:
        """Wall seconds of the whole run, including the attempts before a resume."""
        return self.state.wall_offset + time.perf_counter() - self.started

    def steps_exhausted(self) -> bool:
        return 0 < self.cfg.train.max_steps <= self.state.steps

    def count_bytes(self, nbytes: int) -> None:
        """Traffic outside any round's row (set-up, release, a discarded round): in the run's total only."""
        self.state.traffic_bytes += nbytes

    def note_summary(self, **values: Any) -> None:
        """Values only the engine knows (L-BFGS's function evaluations, say), for every summary.json from now on."""
        self.summary_values.update(values)

    def lost_worker(self, rank: int, host: str, where: str) -> None:
        """fault.survive: a worker was lost (listed in summary.json)."""
        self.lost_workers.append({"rank": rank, "host": host, "where": where})

    # -- a rollback after a non-finite round ----------------------------------------
    def saved_checkpoint(self) -> tuple[dict[str, np.ndarray], int] | None:
        """The latest checkpoint's arrays and round, or None before one (what a NaN rollback goes back to)."""
        path = self.run_dir / CHECKPOINT_NAME
        if not (path.exists() or backup_path(path).exists()):
            return None
        arrays, _, meta = open_checkpoint(path, left_on_disk)  # the weights and the outer state only
        return arrays, int(meta["round"])

    def roll_back(self, round_index: int, checkpoint_round: int, cause: str) -> None:
        """Round ``round_index`` is trained again from ``checkpoint_round``'s weights (-1: the initial
        ones) at half the learning rate: counted, listed in summary.json and said in the log."""
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

    # -- a finished round ---------------------------------------------------------------
    def record_round(self, finished: FinishedRound) -> bool:
        """Write the round's row and update early stopping; True when early stopping says stop.

        Then, when :meth:`checkpoint_due`, the engine hands over the checkpoint's
        :class:`EngineState` (:meth:`checkpoint`), and :meth:`verdict` decides whether the run goes on.
        """
        self.state.consecutive_rollbacks = 0
        self.preempt_reported = self.preempt_reported or finished.preempt
        self.write_row(finished.row)
        # early stopping counts scored rounds only: an unscored round has nothing to compare
        return finished.scored and self.watch(finished.index, finished.row[self.early.monitor], finished.weights)

    def watch(self, index: int, value: float, weights: np.ndarray) -> bool:
        """Early stopping's verdict on a scored round; a new best round's weights are kept, in a file (they
        are read back only when the run ends on them or a checkpoint is written)."""
        stop = self.early.update(index, value)
        if self.early.just_improved:
            if self.best is not None and (self.best.size, self.best.dtype) == (weights.size, weights.dtype):
                self.best.store(weights)  # over the copy kept
            else:
                self.best = SpilledArray(weights)
        return stop

    def verdict(self, finished: FinishedRound, early_stop: bool) -> StopReason | None:
        """After the round's checkpoint: early stopping, divergence, the callbacks, a preemption; None goes on."""
        if early_stop:
            return StopReason.EARLY_STOPPING
        if self.diverged(finished.index, finished.row):
            return StopReason.DIVERGED
        if self.run_callbacks(finished.index, finished.row, finished.weights, finished.model_holds):
            return StopReason.CALLBACK
        if self.preempting() and finished.index + 1 < self.cfg.train.epochs and not self.steps_exhausted():
            return StopReason.PREEMPTED
        return None

    def diverged(self, round_index: int, row: dict[str, Any]) -> bool:
        """Watch for a finite divergence (``train.divergence``); True when the run is to stop for it."""
        cause = self.divergence.update(row) if is_scored(row) else None
        if cause is None:
            return False
        stop = self.cfg.train.stops_on_divergence
        self.state.divergence = {"round": round_index, "cause": cause, "action": "stopped" if stop else "warned"}
        self.log.warning("round %d: the run is diverging: %s; %s", round_index, cause,
                         "stopping and keeping the best weights (train.divergence='stop')" if stop else
                         "training goes on (train.divergence='warn'; 'stop' ends the run here, keeping the best "
                         "weights; lower model.learning_rate to avoid it)")
        return stop

    def run_callbacks(self, round_index: int, row: dict[str, Any], weights: np.ndarray, model_holds: bool) -> bool:
        """The Keras callbacks' ``on_epoch_end`` with the round's weights in the model (``model_holds``: they are
        there already); True when one asked to stop. A learning rate they set goes to the workers with the next
        round."""
        if self.callbacks is None:
            return False
        if not model_holds:
            self.codec.load(self.model, weights)
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
        return self.preempt_reported or self.preemption.requested

    def write_row(self, row: dict[str, Any]) -> None:
        """rounds.csv, the progress line, TensorBoard and the timeline, and summary.json (at most once a second)."""
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

    # -- checkpoints ----------------------------------------------------------------------
    def checkpoint_due(self, round_index: int) -> bool:
        """Every ``checkpoint.every`` rounds, after ``every_seconds``, or on preemption; decided once a round
        (the engine asks before the round closes, to score it and gather what the checkpoint holds)."""
        if self.due is not None and self.due[0] == round_index:
            return self.due[1]
        every, seconds = self.cfg.checkpoint.every, self.cfg.checkpoint.every_seconds
        due = ((every > 0 and (round_index + 1) % every == 0) or self.preempting()
               or (seconds > 0 and time.monotonic() - self.last_checkpoint >= seconds))
        self.due = (round_index, due)
        return due

    def checkpoint(self, round_index: int, weights: CheckpointArray, saved: EngineState) -> None:
        """Write the checkpoint after ``round_index``. The workers' optimizer states are read from ``saved``
        as they are written, one at a time (the engine asks each worker for its state then)."""
        begun = time.perf_counter()
        # the metadata once the states are written: the run's traffic counts their bytes
        save_checkpoint(self.run_dir / CHECKPOINT_NAME, self.checkpoint_arrays(weights, saved),
                        lambda: self.checkpoint_meta(round_index))
        self.last_checkpoint, self.last_checkpoint_round = time.monotonic(), round_index
        self.observers.span("checkpoint", round_index, begun)
        self.log.debug("checkpoint written after round %d", round_index)

    def checkpoint_arrays(self, weights: CheckpointArray, saved: EngineState) -> Iterator[tuple[str, CheckpointArray]]:
        yield "weights", weights
        if self.best is not None:
            yield "best_weights", self.best.streamed()
        yield from saved.outer_arrays.items()
        for rank, vector in saved.optimizer_states.items():  # fetched as the previous one is on disk
            yield f"{ARRAY_PREFIX}{rank}", vector
            del vector

    def checkpoint_meta(self, round_index: int) -> dict[str, Any]:
        workers = range(1, self.workers + 1)
        return {"round": round_index, "rounds_completed": round_index + 1,
                "best_value": self.early.best_value, "best_round": self.early.best_round,
                "wait": self.early.wait, "monitor": self.early.monitor,
                "block_bounds": self.plan.block_bounds, "shuffle_seed": self.plan.shuffle_seed,
                "traffic_bytes": self.state.traffic_bytes, "config": self.cfg.to_dict(),
                "steps": self.state.steps, "lr_scale": self.state.lr_scale, "wall_seconds": self.elapsed(),
                "rollbacks": self.state.rollbacks, "workers": self.workers, "optimizer": self.cfg.model.optimizer,
                "fingerprint": self.fingerprint,
                "rng_seeds": {"train": self.cfg.train.seed, "shuffle": self.plan.shuffle_seed,
                              "workers": [worker_seed(self.cfg.train.seed, w, self.start_round) for w in workers]}}

    def needs_final_checkpoint(self) -> bool:
        """False when the last round's checkpoint already holds what the end would write."""
        if not self.state.rounds:
            return False
        return self.last_checkpoint_round != self.last_round or self.state.stop_reason in KEEPS_BEST

    # -- the end ----------------------------------------------------------------------
    def keeps_best(self) -> bool:
        """Whether the run ends on its best round's weights (after an early, NaN or divergence stop)."""
        return self.state.stop_reason in KEEPS_BEST and self.best is not None

    def final_weights(self, weights: np.ndarray) -> tuple[np.ndarray, dict[str, Any] | None]:
        """The weights kept and their round: the best ones after an early or NaN stop, else the last."""
        rounds = self.state.rounds
        if self.best is not None and self.keeps_best():
            return self.best.read(), next(r for r in rounds if int(r["round"]) == self.early.best_round)
        return weights, (rounds[-1] if rounds else None)

    def final_checkpoint(self, weights: np.ndarray, saved: EngineState) -> None:
        """The checkpoint of the run's end, unless the last round's already holds it: the weights kept (the
        best ones after an early or NaN stop, streamed from their spilled copy) and ``saved``. Before the
        workers are let go: their optimizer states are asked for as it is written."""
        if self.needs_final_checkpoint():
            kept = self.best.streamed() if self.best is not None and self.keeps_best() else weights
            self.checkpoint(self.last_round, kept, saved)

    def finish(self, weights: np.ndarray, model_holds: bool = False) -> dict[str, Any]:
        """Final weights, summary and the per-round table (after :meth:`final_checkpoint`); returns the
        summary. ``model_holds``: the model still holds ``weights`` (the last round's evaluation loaded
        them), so they are not loaded again (Keras' ``set_weights`` costs a copy of the model), unless a
        user's callback had the model in hand since."""
        kept, final = self.final_weights(weights)
        self.kept_weights = kept
        if not (model_holds and kept is weights and (self.callbacks is None or not self.callbacks.from_user)):
            self.codec.load(self.model, kept)
        preempted = self.state.stop_reason == StopReason.PREEMPTED
        if not preempted:  # a preempted run has no final weights yet; its checkpoint carries it on
            save_weights_atomic(self.model, self.run_dir / FINAL_WEIGHTS_NAME)
        summary = self.summary(final)
        write_json_atomic(self.run_dir / SUMMARY_NAME, summary)
        if preempted:
            self.log.warning("preempted (%s): checkpoint written after round %s; exiting with status %d. Run "
                             "the same command again to resume", self.preemption.signal_name or "a worker's signal",
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
        if self.kept_weights is not None and self.model_holds(self.kept_weights):
            return
        self.kept_weights = self.codec.flatten(self.model.get_weights())
        save_weights_atomic(self.model, self.run_dir / FINAL_WEIGHTS_NAME)
        self.log.info("a callback restored other weights at the end of training; %s holds them",
                      FINAL_WEIGHTS_NAME)

    def model_holds(self, weights: np.ndarray) -> bool:
        """Whether the model's variables hold ``weights``, compared one variable at a time (no copy of the
        whole model)."""
        return all(np.array_equal(np.asarray(variable), part)
                   for variable, part in zip(self.model.weights, self.codec.unflatten(weights), strict=True))

    def summary(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
        rounds = self.state.rounds
        final = final or (rounds[-1] if rounds else {})
        counters = self.counters
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
            outer_optimizer=self.outer_optimizer, ssp=self.cfg.aggregation.ssp,
            scheduler_wait_seconds=counters.wait_wall_seconds, scheduler_wait_cpu_seconds=counters.wait_cpu_seconds,
            dataset=self.dataset.describe(), placement=self.placement, lost_workers=self.lost_workers,
            divergence=self.state.divergence,
        )
        return RunSummary(**{**values, **self.summary_values}).as_dict()

    def close(self) -> None:
        self.round_log.close()
        self.observers.close()
