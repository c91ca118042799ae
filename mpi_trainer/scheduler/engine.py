"""What every round-based scheduler engine shares: the global weights, the round's collaborators, the run's frame.

Separation of concerns: an engine owns a round. A subclass supplies
:meth:`Engine.run_rounds` (when workers run and what they get, until a stop);
this base holds what every round needs: the global weights, the outer optimizer
(:class:`~mpi_trainer.algorithms.outer_optimizer.OuterOptimizer`, stepped from a
round's aggregate), the sync schedule (each round's local steps), the
:class:`~mpi_trainer.scheduler.evaluation.Evaluator` that scores the global model,
the NaN policy, the :class:`~mpi_trainer.scheduler.watchdog.Watchdog`, and the
surviving of a lost worker. A finished round goes to the
:class:`~mpi_trainer.scheduler.recorder.RoundRecorder` as values (its row, its weights
and, when a checkpoint is due, the :class:`~mpi_trainer.scheduler.round_row.EngineState`,
whose workers' optimizer states are asked for one at a time as the checkpoint is
written); the recorder writes them and calls no engine method. Everything on the
wire goes through the :class:`~mpi_trainer.comm.protocol.SchedulerLink`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.algorithms import nan_guard
from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.algorithms.rebalance import Measurement, Rebalancer
from mpi_trainer.algorithms.sync_schedule import SyncSchedule, schedule_for
from mpi_trainer.algorithms.wait_bounds import WaitBounds
from mpi_trainer.comm.accounting import Shrunk
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.messages import JobPlan, Report
from mpi_trainer.comm.protocol import Order, SchedulerLink
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.config import Config
from mpi_trainer.config.schema import EVERY_LOCAL_EPOCH
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.placement import moved_rows
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import RankLost, WorkerFailure
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.checkpoint import CheckpointArray
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_record import NO_CONTEXT, RunContext, RunState, StopReason
from mpi_trainer.persistence.spill import SpilledArray
from mpi_trainer.scheduler.evaluation import Evaluator
from mpi_trainer.scheduler.recorder import RoundRecorder
from mpi_trainer.scheduler.round_row import ClosedRound, EngineState, FinishedRound, Outcome, Retry, round_row
from mpi_trainer.scheduler.watchdog import Watchdog


class Engine(ABC):
    rebalancer: Rebalancer | None = None  # data.rebalance: the engine's own, cutting blocks by speed
    # an engine that merges each update as it arrives has no round aggregate to step from: no outer optimizer
    merges_each_update = False
    weights_version = 0  # how many times the global weights were replaced (the workers may hold one version)

    @property
    def weights(self) -> np.ndarray:
        """The global model; every assignment is a new version (:meth:`Evaluator.holds` compares them)."""
        return self._weights

    @weights.setter
    def weights(self, value: np.ndarray) -> None:
        self._weights = value
        self.weights_version += 1

    @property
    def initial_weights(self) -> np.ndarray:
        """The weights the run was built with, read back from the file they were spilled to."""
        return self.initial.read()

    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        self.link, self.cfg, self.dataset, self.model, self.plan = link, cfg, dataset, model, plan
        self.log = get_logger()
        arrays = model.get_weights()  # one host copy of the model, dropped once flattened
        self.codec = WeightCodec.from_weights(arrays)
        self.weights = self.codec.flatten(arrays)  # the global model
        del arrays
        self.initial = SpilledArray(self.weights)  # what a rollback before a checkpoint takes: not in memory
        self.wire = WireFormat(cfg.aggregation.wire_dtype)  # what the weights travel as
        transport = link.transport
        hosts = hosts or [transport.host] * transport.size
        self.watchdog = Watchdog(WaitBounds(cfg.watchdog.setup_timeout, cfg.watchdog.worker_timeout), hosts)
        self.paced: float | None = None  # when the last round closed (or the rounds began)
        self.schedule: SyncSchedule = schedule_for(cfg.train, plan.block_bounds)  # each round's local steps
        # the step from each round's aggregate to the next global model, over the trainable weights only
        self.outer = OuterOptimizer(OuterSettings.from_config(cfg, len(plan.block_bounds), self.merges_each_update),
                                    self.codec.trainable_spans(model))
        self.evaluator = self.make_evaluator()
        self.discarded_bytes = 0  # traffic of rounds rolled back, counted with the next recorded round
        self.recorder = RoundRecorder(cfg, dataset, model, self.codec, plan, run_dir, transport, hosts, resume,
                                      context, outer_optimizer=self.outer.settings.name)
        self.observers = self.recorder.observers
        if resume is not None:
            self.weights = resume.weights
            self.resume_outer(resume)
        self.workers = link.workers

    def make_evaluator(self) -> Evaluator:
        """Who scores the global model: the scheduler itself (an engine may pick another). Called while the
        base engine is built, before a subclass's own attributes exist."""
        return Evaluator(self.cfg, self.dataset, self.model, self.codec)

    def resume_outer(self, resume: ResumeState) -> None:
        """The outer optimizer carries on from the checkpoint's state (or starts fresh without one)."""
        self.outer.load_state(resume.outer_state, resume.weights.size)
        if self.outer.active and not self.outer.state:
            self.log.info("the checkpoint holds no %s outer optimizer state: it starts fresh after round %d",
                          self.outer.settings.name, resume.next_round - 1)

    @property
    def state(self) -> RunState:
        return self.recorder.state

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rows of rounds.csv so far."""
        return self.recorder.state.rounds

    @property
    def run_dir(self) -> Path:
        return self.recorder.run_dir

    def run(self) -> dict[str, Any]:
        """Every round until a stop, then release the workers and write the end of the run."""
        self.recorder.count_bytes(self.link.take_bytes())  # the set-up broadcast
        self.log.info("%s", self.describe())
        self.pace(None)
        try:
            self.recorder.begin()
            self.state.stop_reason = self.run_rounds()
            self.write_checkpoint(self.recorder.last_round, self.weights, final=True)
            # the checkpoint holds the outer optimizer's state now: let it go before the end's files (Keras'
            # save copies each variable as it writes it; the state may be twice the model)
            self.outer.reset()
            try:
                self.link.stop(preempted=self.state.stop_reason == StopReason.PREEMPTED)
            except TimeoutError as exc:
                raise self.watchdog.timed_out("take its order to stop", exc, self.workers) from None
            self.recorder.count_bytes(self.link.take_bytes())
            # the model still holds the last scored weights unless they changed since
            summary = self.recorder.finish(self.weights, self.evaluator.loaded_version == self.weights_version)
            if self.recorder.kept_weights is not None:
                self.weights = self.recorder.kept_weights
            return summary
        finally:
            self.close()

    @property
    def wire_bytes(self) -> int:
        """Bytes of one copy of the weights on the wire."""
        return self.codec.size * self.wire.itemsize

    def describe(self) -> str:
        return (f"{len(self.workers)} workers, {self.cfg.aggregation.method} aggregation, model "
                f"{self.cfg.model.name} ({self.codec.size} parameters, {self.codec.nbytes / 2**20:.2f} MiB per copy)")

    @abstractmethod
    def run_rounds(self) -> StopReason:
        """Rounds from the start (or resume) point until one says stop; returns why."""

    # -- a round's end ----------------------------------------------------------------
    def evaluation_due(self, round_index: int) -> bool:
        """Whether this round is scored: every ``evaluation.every``-th, the last, and any checkpointed one.

        ``evaluation.every = 0`` (the default) scores once per local epoch, as ``fit`` does: every
        round when a round is a local epoch, else the round that completes one (of the largest
        block). During a sync warm-up a round is a step or a few, so there ``evaluation.every``
        counts local epochs (the warm-up round that completes one) instead of rounds.
        """
        every, schedule = self.cfg.evaluation.every, self.schedule
        last = round_index + 1 >= self.cfg.train.epochs or self.recorder.steps_exhausted()
        if every == EVERY_LOCAL_EPOCH:
            due = schedule.closes_epoch(round_index)
        elif schedule.in_warmup(round_index):
            epochs = (round_index + 1) // schedule.rounds_per_warmup_epoch
            due = schedule.closes_warmup_epoch(round_index) and epochs % every == 0
        else:
            due = (round_index - schedule.warmup_rounds + 1) % every == 0
        return due or last or self.recorder.checkpoint_due(round_index)

    def score(self, closed: ClosedRound) -> FinishedRound:
        """The round scored when :meth:`evaluation_due`, and its row but for the engine's timing columns."""
        scored = self.evaluation_due(closed.index)
        evaluation: dict[str, float] = {}
        eval_seconds = 0.0
        if scored:
            evaluation, eval_seconds = self.evaluator.evaluate(self.weights, closed.index, self.weights_version)
            self.observers.span("evaluate", closed.index, time.perf_counter() - eval_seconds)
        row = round_row(closed, evaluation, self.plan.metric_names, len(self.plan.block_bounds),
                        self.schedule.steps(closed.index), self.discarded_bytes)
        self.discarded_bytes = 0
        row["eval_seconds"] = eval_seconds
        # the scheduler's evaluation loads the weights into its model; the workers' (evaluation.where) does not
        return FinishedRound(closed.index, row, self.weights, scored, any(r.preempt for r in closed.reports),
                             model_holds=self.evaluator.loaded_version == self.weights_version)

    def record(self, finished: FinishedRound) -> StopReason | None:
        """Hand the finished round to the recorder, with the checkpoint's state when one is due; returns a
        stop reason or None."""
        early_stop = self.recorder.record_round(finished)
        if self.recorder.checkpoint_due(finished.index):
            self.write_checkpoint(finished.index, finished.weights)
        return self.recorder.verdict(finished, early_stop)

    def write_checkpoint(self, after_round: int, weights: np.ndarray, final: bool = False) -> None:
        """The checkpoint after ``after_round`` (``final``: the run's end, written if the last round's does
        not hold it). It holds the outer optimizer's state and the workers' optimizer states
        (:meth:`optimizer_states`), each asked of its worker as the file is written. Under ``fault.survive``
        a worker lost meanwhile leaves the checkpoint to the survivors' states."""
        while True:
            saved = EngineState(self.optimizer_states(after_round), self.outer.state_arrays())
            try:
                if final:
                    self.recorder.final_checkpoint(weights, saved)
                else:
                    self.recorder.checkpoint(after_round, weights, saved)
                return
            except RankLost as error:
                self.survive_loss(error, after_round + 1, f"the optimizer state gathered after round {after_round}")

    def optimizer_states(self, after_round: int) -> Mapping[int, CheckpointArray]:
        """Each worker's optimizer vector for a checkpoint after ``after_round``, by rank, asked of the worker
        when read (none by default)."""
        return {}

    # -- the NaN policy -------------------------------------------------------
    def non_finite_cause(self, reports: list[Report], aggregate: np.ndarray | None = None) -> str | None:
        """Why the round's result cannot be kept (a worker's non-finite loss or weights, or a non-finite
        ``aggregate`` when given), or None."""
        outcomes = [nan_guard.WorkerOutcome(r.rank, r.train_loss, r.weights_finite) for r in reports]
        return nan_guard.non_finite_cause(outcomes, aggregate)

    def apply_nan_policy(self, round_index: int, cause: str, before: np.ndarray | None,
                         received: int) -> tuple[Outcome, np.ndarray]:
        """Apply ``train.nan_policy``: (NAN, the weights before the round) or (RETRY, the weights to rerun from).

        ``before`` None: the round's step wrote part of its aggregate over the weights it started from before
        a later part showed non-finite values; a stop then keeps the weights a rollback would go back to."""
        self.discarded_bytes += received
        policy, rollbacks = self.cfg.train.nan_policy, self.state.consecutive_rollbacks
        if nan_guard.decide(policy, rollbacks) == nan_guard.STOP:
            self.log.error("round %d: %s; stopping (train.nan_policy=%r, %d rollbacks in a row), keeping "
                           "the best weights", round_index, cause, policy, rollbacks)
            if before is None:
                before, checkpoint_round = self.last_good_weights()
                if self.recorder.best is None:  # else the run ends on its best round, as every NaN stop does
                    self.log.warning("round %d had already replaced part of the weights it started from: the "
                                     "run ends on %s", round_index, "the initial weights" if checkpoint_round < 0
                                     else f"the weights of round {checkpoint_round}'s checkpoint")
            return StopReason.NAN, before
        weights, checkpoint_round = self.last_good_weights()
        self.recorder.roll_back(round_index, checkpoint_round, cause)
        return Retry.ROUND, weights

    def last_good_weights(self) -> tuple[np.ndarray, int]:
        """The latest checkpoint's weights and round, or the initial weights (round -1) before one.

        The outer optimizer goes back with them: to the checkpoint's state, or fresh before one.
        """
        saved = self.recorder.saved_checkpoint()
        if saved is None:
            self.outer.reset()
            return self.initial_weights, -1
        arrays, checkpoint_round = saved
        self.outer.load_state(arrays, self.codec.size)
        return arrays["weights"].astype(np.float32), checkpoint_round

    def pace(self, closed: int | None) -> None:
        """Round ``closed`` has been recorded (None: the rounds begin): the watchdog learns how long the
        whole round took, and every wait from here on (this rank's, and through the orders the workers')
        follows the bound it derives."""
        now = time.perf_counter()
        if closed is not None and self.paced is not None:
            self.watchdog.observe(now - self.paced)
        self.paced = now
        transport = self.link.transport
        transport.bound = self.watchdog.timeout
        transport.phase = "the rounds" if closed is None else f"after round {closed}"
        if closed is not None:
            hooks.maybe_freeze(0, closed)

    def close(self) -> None:
        self.recorder.close()

    # -- rebalancing ----------------------------------------------------------------
    def seed_speeds(self, speeds: Mapping[int, Measurement], seconds: float = 0.0) -> None:
        """Rebalancing: cut the first round's blocks from the steps each worker timed before it.

        ``speeds``: worker rank -> its calibration (:meth:`Worker.calibrate`). Without it the
        first round would run on equal blocks at the slowest worker's pace. ``seconds``: how long
        the calibration took, counted in the run's wall time (elapsed_seconds, summary.json).
        """
        if self.rebalancer is None or not speeds:
            return
        self.state.wall_offset += seconds
        if self.rebalancer.update({rank - 1: speed for rank, speed in sorted(speeds.items())}):
            self.adopt_bounds(self.recorder.start_round)
            self.log.info("before round %d blocks cut by calibrated speed %s", self.recorder.start_round,
                          self.rebalancer.describe(self.workers))

    def adopt_bounds(self, start_round: int) -> None:
        """The rebalancer's blocks become the plan from ``start_round`` on (the orders carry them)."""
        if self.rebalancer is not None:
            self.plan.block_bounds = [(start, end) for start, end in self.rebalancer.bounds]

    def hand_over_rows(self, worker: int, positions: np.ndarray, round_index: int) -> None:
        """Scatter: the rows that changed owner go to their new worker before it reads its block."""
        try:
            nbytes = self.link.send_rows(worker, moved_rows(self.dataset, positions), self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure(f"take its training rows for round {round_index}", [worker]) from None
        if len(positions):
            self.log.info("round %d: sent worker rank %d %d training rows that changed owner (%.2f MB)",
                          round_index, worker, len(positions), nbytes / 1e6)

    # -- surviving a lost worker (fault.survive) ----------------------------------------
    def survive_loss(self, error: RankLost, next_round: int, where: str) -> None:
        """Shrink to the survivors, name the lost, re-plan their blocks from ``next_round`` on.

        Without ``fault.survive`` the loss ends the job as any error does. Below
        ``fault.min_workers`` the job checkpoints and exits for ``launch`` to restart it.
        """
        if not self.cfg.fault.survive:
            raise error
        while True:
            self.drop_lost(self.link.shrink(self.watchdog.timeout), where)
            try:
                self.link.agree()  # a rank lost during the shrink: shrink again
                break
            except RankLost:
                continue
        self.workers = self.link.workers
        if len(self.workers) < self.cfg.fault.min_workers:
            self.end_short_handed(next_round)
        self.replan(next_round)

    def drop_lost(self, shrunk: Shrunk, where: str) -> None:
        """Forget the lost ranks' hosts (the others are renumbered in order) and say who was lost."""
        hosts = self.watchdog.hosts
        for rank, world_rank in zip(shrunk.lost, shrunk.lost_world):
            self.log.warning("%s: worker rank %d on host %s was lost; carrying on with %d workers", where,
                             world_rank, hosts[rank], len(shrunk.survivors) - 1)
            self.recorder.lost_worker(world_rank, hosts[rank], where)
        self.watchdog.hosts = [hosts[rank] for rank in shrunk.survivors]
        self.renumber(shrunk.survivors)

    def renumber(self, survivors: list[int]) -> None:
        """What the engine keeps per worker rank follows the survivors' new numbers (index in ``survivors``)."""
        return None  # nothing in the base engine is kept per rank

    def end_short_handed(self, next_round: int) -> None:
        """Fewer workers than ``fault.min_workers``: checkpoint the last recorded round, then fail."""
        last = self.recorder.last_round
        if last >= 0:  # with no round recorded yet, a restart starts over
            self.write_checkpoint(last, self.weights)
        raise WorkerFailure(f"{len(self.workers)} workers left, fewer than fault.min_workers="
                            f"{self.cfg.fault.min_workers}; checkpointed after round {last} and ending the job "
                            f"for `launch` to restart it")

    def replan(self, next_round: int) -> None:
        """Blocks for the survivors, as an elastic resume plans them; the next orders carry them."""
        self.plan.block_bounds = block_bounds(self.plan.num_train, len(self.workers))
        if self.rebalancer is not None:
            self.rebalancer = Rebalancer(self.plan.block_bounds, self.cfg.data.rebalance_smoothing)
        self.log.info("blocks re-planned for %d workers from round %d: %s", len(self.workers), next_round,
                      ", ".join(f"[{start}, {end})" for start, end in self.plan.block_bounds))

    def send_order(self, worker: int, order: Order) -> None:
        """An order, which a worker that stopped taking messages cannot hold up for longer than the bound."""
        try:
            self.link.send_order(worker, order)
        except TimeoutError:
            raise self.watchdog.failure(f"take its order for {order.describe()}", [worker]) from None

