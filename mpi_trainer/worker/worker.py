"""A training rank (ranks 1..N-1).

Separation of concerns: the scheduler owns the global weights, the block plan,
aggregation, evaluation, early stopping and every file in the run directory.
A worker owns its local model, its optimizer state and its block of the
training set. It waits for orders, trains one local epoch per round on its
block (or, at ``train.sync_every = k``, k steps of a shuffled walk through the
block that carries on from round to round) and hands back its weights and metrics, in the shape the aggregation
method wants (a scaled contribution to a reduction, or a scored candidate for
election; under SSP, its weights point to point). With rebalancing the order
names the block to train on, and under scatter the rows that changed owner
follow it. It never decides when to stop and never writes files. It speaks
only through its :class:`~mpi_trainer.comm.protocol.WorkerLink`. The training
itself (one local epoch, k steps, scoring) is done by the
:class:`~mpi_trainer.worker.training.LocalTraining` it holds, which owns the local model;
the worker hands it the global weights and sends what it returns.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.algorithms import aggregation
from mpi_trainer.algorithms.rebalance import MIN_TIMED_STEPS, Measurement
from mpi_trainer.comm.protocol import (
    EvaluateOrder,
    JobPlan,
    Order,
    Report,
    RoundOrder,
    SendOptimizerOrder,
    SendWeightsOrder,
    StopOrder,
    UpdateOrder,
    WorkerLink,
)
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.config import Config
from mpi_trainer.data.placement import HeldBlock, HeldRows, WorkerData, peak_rss_mib, worker_data
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import RankLost, WorkerFailure
from mpi_trainer.logs import get_logger
from mpi_trainer.models import flat_metric_state, rebuild_model, summed_metric_state
from mpi_trainer.models.dry_run import dry_run, reset_optimizer
from mpi_trainer.persistence.optimizer_state import ensure_built, load_state_vector, state_parts, state_size
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.reporting.timeline import PhaseLog
from mpi_trainer.worker.slowdown import make_slowdown
from mpi_trainer.worker.training import LocalTraining, one_step


class Worker:
    """Serves the scheduler's orders; ``preemption_state``: the job's preemption state, which its signal
    handlers set and its reports pass on (None: no signal reaches this worker)."""

    # What trains a round; a test substitutes a subclass that records what each round trained.
    training_type: type[LocalTraining] = LocalTraining

    def __init__(self, link: WorkerLink, plan: JobPlan, dataset: Dataset, cfg: Config,
                 data: WorkerData | None = None, preemption_state: Preemption | None = None) -> None:
        self.link = link
        self.cfg = cfg
        self.rank = link.rank
        self.log = get_logger()
        self.preemption = Preemption() if preemption_state is None else preemption_state
        model = rebuild_model(plan.model)
        ensure_built(model)
        # The block (and, with increment, each round's draw) comes from the data placement.
        self.data = data if data is not None else worker_data(dataset.train, plan, self.rank, cfg)
        self.phases = PhaseLog(cfg.log.timeline)  # this rank's phases, handed on with its next report
        test_hooks = hooks.active()  # read once here rather than every round
        self.training = self.training_type(
            model, self.data, dataset, cfg, plan, self.phases, make_slowdown(test_hooks, self.rank),
            test_hooks.nan_round if test_hooks.nan_rank == self.rank else None)
        # the weights a round starts from as they arrive, then the ones it trained (the model holds the start)
        self.global_weights = self.training.codec.empty()
        self.wire = WireFormat(cfg.aggregation.wire_dtype)
        # where an SSP update's weights land: the float32 buffer itself, or a 16-bit one decoded into it (made
        # at the first; a synchronous round's broadcast is decoded segment by segment as it arrives)
        self.arriving: np.ndarray | None = None
        self.candidate: np.ndarray | None = None  # best-of: this round's trained weights, until elected or not
        # (round, phase) in which this worker ends itself, if it does
        self.crash_at = ((test_hooks.crash_round, test_hooks.crash_phase)
                         if test_hooks.crash_rank == link.world_rank else None)
        self.preempted = False  # the scheduler's STOP said the run was preempted

    @property
    def model(self) -> Any:
        """The local Keras model (its training's)."""
        return self.training.model

    def run(self) -> None:
        """Serve orders until the scheduler says stop."""
        while True:
            try:
                if not self.serve(self.link.recv_order()):
                    return
            except RankLost as error:
                self.rejoin(error)

    def serve(self, order: Order) -> bool:
        """Carry out one order; False once it is the order to stop."""
        match order:
            case RoundOrder():
                self.run_round(order)
            case UpdateOrder():
                self.run_update(order)
            case SendWeightsOrder():
                self.send_candidate(order)
            case SendOptimizerOrder():
                self.send_optimizer(order)
            case EvaluateOrder():
                self.evaluate(order)
            case StopOrder():
                self.log.debug("stop received; peak RSS %.1f MiB", peak_rss_mib())
                self.preempted = order.preempted
                return False
            case _:
                raise RuntimeError(f"unknown order {order!r} from the scheduler")
        return True

    def rejoin(self, error: RankLost) -> None:
        """fault.survive: a rank was lost; carry on with the survivors, under this worker's new rank.

        Whatever this worker was doing is dropped: the scheduler redoes the round, and its next
        order carries the blocks re-planned for the survivors. A lost scheduler ends the job.
        """
        if not self.cfg.fault.survive:
            raise error
        while True:
            self.link.shrink()
            if not self.link.scheduler_alive:
                raise WorkerFailure("the scheduler (rank 0) was lost; ending the job for `launch` to restart it")
            try:
                self.link.agree()
                break
            except RankLost:
                continue  # another rank was lost during the shrink
        self.rank = self.data.rank = self.link.rank
        self.log.info("a rank was lost; carrying on as worker rank %d of %d", self.rank, self.link.workers)

    def maybe_crash(self, round_index: int, phase: str) -> None:
        """Test hook (crash_rank / crash_round / crash_phase): end this process as kill -9 would."""
        if self.crash_at == (round_index, phase):
            self.log.warning("test hook: ending this worker hard in round %d (%s)", round_index, phase)
            self.link.crash()

    def preflight(self) -> None:
        """Before round 0: one step and one evaluation on this worker's first batch (fails every rank
        with a clear message when the model, the labels and the loss do not fit together).

        Rounds of k steps end every pass over the block with a partial batch, whose new shape the
        backend traces again: a pause of a few hundred milliseconds in the middle of a synchronous
        round, which every other worker waits out. It is traced here, with the weights put back.
        """
        batch = self.cfg.train.batch_size
        dry_run(self.model, *self.data.first_rows(batch))
        schedule = self.training.schedule
        trailing = self.data.trailing_rows(batch) if schedule.sync_every or schedule.warmup_rounds else None
        if trailing is not None:
            dry_run(self.model, *trailing)

    def calibrate(self) -> Measurement | None:
        """Rebalancing: time a few training steps on this worker's block before round 0.

        The scheduler cuts round 0's blocks from these speeds, so that the first round does not run
        at the slowest worker's pace. One untimed step, then ``MIN_TIMED_STEPS`` timed ones, through
        the same slowdown as training (a fresh one, whose first batch is not slowed either); the
        weights and the optimizer state are put back. None without rebalancing, or without a full batch.
        """
        batch = self.cfg.train.batch_size
        if not self.cfg.data.rebalance or len(self.data.first_rows(batch)[1]) < batch:
            return None
        slowdown, weights, seconds = make_slowdown(hooks.active(), self.rank), self.model.get_weights(), 0.0
        span = self.data.units(self.data.fixed_x) - batch + 1  # where a batch of the block may start
        try:
            for step in range(MIN_TIMED_STEPS + 1):
                x, y = self.data.batch(np.arange(batch) + (step * batch) % span)
                started = time.perf_counter()
                one_step(self.model, x, y, slowdown)
                seconds += (time.perf_counter() - started) if step else 0.0
        finally:
            self.model.set_weights(weights)
            reset_optimizer(self.model.optimizer)
        samples = MIN_TIMED_STEPS * batch
        return Measurement(samples, seconds, samples / seconds, MIN_TIMED_STEPS)

    def send_candidate(self, order: SendWeightsOrder) -> None:
        if self.candidate is None:
            raise RuntimeError("the scheduler asked for this worker's candidate weights before a round trained them")
        self.link.send_weights(self.wire.encode(self.candidate))

    def send_optimizer(self, order: SendOptimizerOrder) -> None:
        self.link.send_state(state_parts(self.model.optimizer), state_size(self.model.optimizer))

    def train(self, round_index: int, max_steps: int | None = None) -> tuple[Report, np.ndarray]:
        """This round's training from the global weights; its report says whether this process was
        asked to stop (a preemption signal)."""
        report, local = self.training.train_and_report(round_index, self.global_weights, max_steps)
        report.preempt = self.preemption.requested
        return report, local

    # -- a synchronous round -----------------------------------------------------
    def run_round(self, order: RoundOrder) -> None:
        self.follow_blocks(order.blocks, order.moved_rows, order.round)
        self.apply_optimizer_changes(order)
        self.link.take_bytes()
        waited = time.time()
        if order.held_weights:  # the weights of the last EvaluateOrder are this round's
            # "ready": lets the scheduler's watchdog name a rank that stopped before training
            # (a broadcast's own arrival messages do that when one follows).
            self.link.send_ready(order.round)
        else:
            self.link.recv_global(self.global_weights, self.wire)
        self.phases.add("wait", order.round, waited)
        self.maybe_crash(order.round, "train")
        report, local = self.train(order.round, order.max_steps)
        elects = self.cfg.aggregation.elects
        if elects:
            self.training.score(report)
            self.candidate = local
        report.bytes_before_report = self.link.take_bytes()
        report.phases, sending = self.phases.take(), time.time()
        # The report goes first, so a scheduler that times out knows which rank is missing.
        self.link.send_report(report)
        self.maybe_crash(order.round, "contribute")
        if not elects:
            local *= np.float32(aggregation.contribution_scale(
                self.cfg.aggregation.method, report.samples, self.data.round_total(order.round), self.link.workers))
            self.link.contribute_weights(local, self.wire)
        self.phases.add("send", order.round, sending)
        self.log.debug("round %d: loss %.4f acc %.4f in %.2f s on %d samples", order.round,
                       report.train_loss, report.train_accuracy, report.train_seconds, report.samples)
        hooks.maybe_freeze(self.rank, order.round)

    # -- scoring a shard of the global model (evaluation.where = "workers") ----------------
    def evaluate(self, order: EvaluateOrder) -> None:
        """Take the global weights (float32, whatever the wire format), score this worker's shard of the
        test split (and of the validation split) and add the metrics' summed state to the scheduler's."""
        started = time.time()
        self.link.recv_broadcast(self.global_weights)
        self.training.take_weights(self.global_weights)
        shard, batch = self.data.evaluation, max(256, self.cfg.train.batch_size)
        if shard is None:
            raise RuntimeError("the scheduler asked this worker to evaluate, but it holds no shard of the test split")
        state = summed_metric_state(self.model, shard.x_test, shard.y_test, batch)
        if order.score_validation:
            state += summed_metric_state(self.model, shard.x_val, shard.y_val, batch)
        self.link.contribute_metric_state(flat_metric_state(state))
        self.phases.add("evaluate", order.round, started)

    def apply_optimizer_changes(self, order: RoundOrder) -> None:
        """Optimizer changes the scheduler asks for before a round (NaN rollback, resume)."""
        optimizer = self.model.optimizer
        if order.optimizer_state:
            load_state_vector(optimizer, self.link.recv_state())
        if order.reset_optimizer:
            reset_optimizer(optimizer)  # moments computed from non-finite gradients would poison the next round
        if order.learning_rate is not None:
            optimizer.learning_rate = order.learning_rate
            self.log.debug("learning rate set to %g", order.learning_rate)

    def follow_blocks(self, blocks: list[tuple[int, int]] | None, moved_rows: int | None, when: int) -> None:
        """Rebalancing: adopt the ``blocks`` the scheduler re-cut for round ``when`` (an SSP update's clock).

        Under scatter the rows that changed owner follow the order (``moved_rows``); otherwise only bounds travel.
        """
        if blocks is None:
            return
        if moved_rows is not None:
            rows = self.link.recv_rows()
            if not isinstance(self.data, HeldBlock):
                raise TypeError("rows were sent to a worker whose block is streamed (scatter refuses streamed inputs)")
            self.data.take_rows(HeldRows(rows.positions, rows.x, rows.y), blocks, when)
        if self.data.set_blocks(blocks):
            self.log.debug("round %d: block now [%d, %d)", when, *blocks[self.rank - 1])

    # -- an SSP update --------------------------------------------------------------
    def run_update(self, order: UpdateOrder) -> None:
        """SSP: receive the current global weights, train once, send the report and the weights back."""
        self.follow_blocks(order.blocks, order.moved_rows, order.clock)  # an SSP update's data follows its clock
        if order.learning_rate is not None:  # a Keras callback's rate on the scheduler
            self.model.optimizer.learning_rate = order.learning_rate
        self.link.take_bytes()
        waited = time.time()
        if self.arriving is None:
            self.arriving = self.wire.landing(self.global_weights)
        self.link.recv_weights(self.arriving)
        self.wire.decode(self.arriving, self.global_weights)
        self.phases.add("wait", order.clock, waited)
        self.maybe_crash(order.clock, "train")
        report, local = self.train(order.clock)
        if self.cfg.aggregation.elects:
            self.training.score(report)
        report.phases, sending = self.phases.take(), time.time()
        self.link.send_report(report)
        self.maybe_crash(order.clock, "contribute")
        self.link.send_weights(self.wire.encode(local))
        self.phases.add("send", order.clock, sending)
        hooks.maybe_freeze(self.rank, order.clock)
