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
only through its :class:`~mpi_trainer.comm.protocol.WorkerLink`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from mpi_trainer.algorithms import aggregation
from mpi_trainer.algorithms.rebalance import MIN_TIMED_STEPS, Measurement
from mpi_trainer.algorithms.step_budget import steps_per_round
from mpi_trainer.algorithms.sync_schedule import schedule_for
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import JobPlan, Order, OrderKind, Report, WorkerLink
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.config import Config
from mpi_trainer.data.feed import fit_arguments
from mpi_trainer.data.placement import HeldRows, WorkerData, peak_rss_mib
from mpi_trainer.data.sources import Dataset
from mpi_trainer.data.walk import BlockWalk
from mpi_trainer.data.weights import training_weights
from mpi_trainer.errors import RankLost, WorkerFailure
from mpi_trainer.hooks import maybe_freeze
from mpi_trainer.logs import get_logger
from mpi_trainer.models import evaluate_model, flat_metric_state, rebuild_model, summed_metric_state
from mpi_trainer.models.dry_run import dry_run, reset_optimizer
from mpi_trainer.persistence.optimizer_state import ensure_built, load_state_vector, state_vector
from mpi_trainer.persistence.preemption import preemption
from mpi_trainer.persistence.resume import worker_seed
from mpi_trainer.reporting.progress import with_batch_progress
from mpi_trainer.reporting.timeline import PhaseLog
from mpi_trainer.worker.slowdown import make_slowdown
from mpi_trainer.worker.step_timer import StepTimer


class Worker:
    def __init__(self, link: WorkerLink, plan: JobPlan, dataset: Dataset, cfg: Config,
                 data: WorkerData | None = None) -> None:
        self.link = link
        self.cfg = cfg
        self.rank = link.rank
        self.log = get_logger()
        self.model = rebuild_model(plan.model)
        ensure_built(self.model)
        self.codec = WeightCodec.from_weights(self.model.get_weights())
        self.finalized = layers_with_state(self.model)  # e.g. an adapted Normalization: its stats are weights
        self.global_weights = self.codec.empty()
        self.local = self.codec.empty()  # the trained weights, flattened into the same buffer every round
        self.wire = WireFormat(cfg.aggregation.wire_dtype)
        # where weights from the scheduler land: the float32 buffer itself, or a 16-bit one decoded into it
        self.arriving = self.wire.landing(self.global_weights)
        self.candidate: np.ndarray | None = None
        self.dataset = dataset
        # The block (and, with increment, each round's draw) comes from the data placement.
        self.data = data if data is not None else WorkerData(dataset.train, plan, self.rank, cfg)
        self.x, self.y = self.data.fixed_x, self.data.fixed_y
        self.slowdown = make_slowdown(cfg.debug, self.rank)
        # Test hooks, read once here rather than every round: the round NaN is injected in (None: never,
        # cleared once done) and whether every round starts with a fresh optimizer state.
        self.nan_round = cfg.debug.nan_round if cfg.debug.nan_rank == self.rank else None
        self.reset_every_round = cfg.debug.reset_optimizer
        debug = cfg.debug  # debug.crash_*: (round, phase) in which this worker ends itself, if it does
        self.crash_at = (debug.crash_round, debug.crash_phase) if debug.crash_rank == link.world_rank else None
        self.step_timer = StepTimer(cfg.train.batch_size)  # the speed that rebalancing cuts blocks by
        self.shuffle_rng = np.random.default_rng(worker_seed(cfg.train.seed, self.rank, plan.start_round))
        self.walk = BlockWalk(self.shuffle_rng, cfg.train.shuffle)  # k-step rounds; a resumed run starts a fresh walk
        self.class_weight = plan.class_weight
        self.schedule = schedule_for(cfg.train, plan.block_bounds)  # steps per round, as the scheduler has it
        self.phases = PhaseLog(cfg.log.timeline)  # this rank's phases, handed on with its next report
        self.preempted = False  # the scheduler's STOP said the run was preempted

    def run(self) -> None:
        """Serve orders until the scheduler says stop."""
        handlers = {OrderKind.ROUND: self.run_round, OrderKind.UPDATE: self.run_update,
                    OrderKind.SEND_WEIGHTS: self.send_candidate, OrderKind.SEND_OPTIMIZER: self.send_optimizer,
                    OrderKind.EVALUATE: self.evaluate}
        while True:
            try:
                order = self.link.recv_order()
                if order.kind == OrderKind.STOP:
                    self.log.debug("stop received; peak RSS %.1f MiB", peak_rss_mib())
                    self.preempted = order.preempted
                    return
                if order.kind not in handlers:
                    raise RuntimeError(f"unknown order {order.kind!r} from the scheduler")
                handlers[order.kind](order)
            except RankLost as error:
                self.rejoin(error)

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
        """Test hook (debug.crash_rank / crash_round / crash_phase): end this process as kill -9 would."""
        if self.crash_at == (round_index, phase):
            self.log.warning("debug: ending this worker hard in round %d (%s)", round_index, phase)
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
        partial = 0 if self.data.streams else len(self.data.fixed_x) % batch
        if partial and (self.schedule.sync_every or self.schedule.warmup_rounds):
            dry_run(self.model, self.x[:partial], self.y[:partial])

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
        slowdown, weights, seconds = make_slowdown(self.cfg.debug, self.rank), self.model.get_weights(), 0.0
        try:
            for step in range(MIN_TIMED_STEPS + 1):
                x, y = self.data.batch(np.arange(batch) + (step * batch) % (self.data.units(self.x) - batch + 1))
                started = time.perf_counter()
                one_step(self.model, x, y, slowdown)
                seconds += (time.perf_counter() - started) if step else 0.0
        finally:
            self.model.set_weights(weights)
            reset_optimizer(self.model.optimizer)
        samples = MIN_TIMED_STEPS * batch
        return Measurement(samples, seconds, samples / seconds, MIN_TIMED_STEPS)

    def send_candidate(self, order: Order) -> None:
        self.link.send_weights(self.wire.encode(self.candidate))

    def send_optimizer(self, order: Order) -> None:
        self.link.send_state(state_vector(self.model.optimizer))

    # -- a synchronous round -----------------------------------------------------
    def run_round(self, order: Order) -> None:
        self.follow_blocks(order)
        self.apply_optimizer_changes(order)
        self.link.take_bytes()
        waited = time.time()
        if order.held_weights:  # the weights of the last EVALUATE are this round's
            # "ready": lets the scheduler's watchdog name a rank that stopped before training
            # (a broadcast's own arrival messages do that when one follows).
            self.link.send_ready(order.round)
        else:
            self.link.recv_broadcast(self.arriving)
            self.wire.decode(self.arriving, self.global_weights)
        self.phases.add("wait", order.round, waited)
        self.maybe_crash(order.round, "train")
        report, local = self.train_and_report(order.round, order.max_steps)
        elects = self.cfg.aggregation.elects
        if elects:
            self.score(report)
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
        maybe_freeze(self.cfg.debug, self.rank, order.round)

    # -- scoring a shard of the global model (evaluation.where = "workers") ----------------
    def evaluate(self, order: Order) -> None:
        """Take the global weights (float32, whatever the wire format), score this worker's shard of the
        test split (and of the validation split) and add the metrics' summed state to the scheduler's."""
        started = time.time()
        self.link.recv_broadcast(self.global_weights)
        self.take_weights(self.global_weights)
        shard, batch = self.data.evaluation, max(256, self.cfg.train.batch_size)
        state = summed_metric_state(self.model, shard.x_test, shard.y_test, batch)
        if order.score_validation:
            state += summed_metric_state(self.model, shard.x_val, shard.y_val, batch)
        self.link.contribute_metric_state(flat_metric_state(state))
        self.phases.add("evaluate", order.round, started)

    def apply_optimizer_changes(self, order: Order) -> None:
        """Optimizer changes the scheduler asks for before a round (NaN rollback, resume)."""
        optimizer = self.model.optimizer
        if order.optimizer_state:
            load_state_vector(optimizer, self.link.recv_state())
        if order.reset_optimizer or self.reset_every_round:
            reset_optimizer(optimizer)  # moments computed from non-finite gradients would poison the next round
        if order.learning_rate is not None:
            optimizer.learning_rate = order.learning_rate
            self.log.debug("learning rate set to %g", order.learning_rate)

    def follow_blocks(self, order: Order) -> None:
        """Rebalancing: adopt the blocks the scheduler re-cut for this round.

        Under scatter the rows that changed owner follow the order; otherwise only bounds travel.
        """
        if order.blocks is None:
            return
        when = order.round if order.kind == OrderKind.ROUND else order.clock  # an SSP update's data follows its clock
        if order.moved_rows is not None:
            rows = self.link.recv_rows()
            self.data.take_rows(HeldRows(rows.positions, rows.x, rows.y), order.blocks, when)
        if self.data.set_blocks(order.blocks):
            self.log.debug("round %d: block now [%d, %d)", when, *order.blocks[self.rank - 1])

    # -- an SSP update --------------------------------------------------------------
    def run_update(self, order: Order) -> None:
        """SSP: receive the current global weights, train once, send the report and the weights back."""
        self.follow_blocks(order)
        if order.learning_rate is not None:  # a Keras callback's rate on the scheduler
            self.model.optimizer.learning_rate = order.learning_rate
        self.link.take_bytes()
        waited = time.time()
        self.link.recv_weights(self.arriving)
        self.wire.decode(self.arriving, self.global_weights)
        self.phases.add("wait", order.clock, waited)
        report, local = self.train_and_report(order.clock)
        if self.cfg.aggregation.elects:
            self.score(report)
        report.phases, sending = self.phases.take(), time.time()
        self.link.send_report(report)
        self.link.send_weights(self.wire.encode(local))
        self.phases.add("send", order.clock, sending)
        maybe_freeze(self.cfg.debug, self.rank, order.clock)

    # -- training and scoring -----------------------------------------------------------
    def take_weights(self, flat: np.ndarray) -> None:
        """Load flat weights into the local model, and let layers that derive tensors from their weights
        (an adapted ``Normalization``'s mean and variance) recompute them, as Keras does on loading."""
        self.model.set_weights(self.codec.unflatten(flat))
        if self.finalized:  # the scheduler's first weights carry the stats; they never change after
            finalize_layers(self.finalized, self.model)
            self.finalized = []

    def sample_weights(self, y: np.ndarray, block_rows: np.ndarray | None = None) -> np.ndarray | None:
        """The training weights of these labels' rows (``block_rows``: their places in the fixed block,
        None: the whole block or round), from ``fit``'s ``class_weight`` and ``sample_weight``."""
        given = getattr(self.dataset.train, "weights", None) if self.dataset is not None else None
        if given is not None:  # refused with increment, rebalance and scatter: the round's rows are the block
            given = given[self.dataset.train.rows[self.data.fixed]]
            given = given if block_rows is None else given[block_rows]
        return training_weights(y, self.class_weight, given)

    def train_and_report(self, round_index: int, max_steps: int | None = None) -> tuple[Report, np.ndarray]:
        """This round's training from the global weights (one local epoch, or k steps); report and new weights."""
        k = self.schedule.steps(round_index)
        if k:
            # k-step rounds walk the fixed block (the config refuses data increment), augmenting per batch
            self.x, self.y = self.data.fixed_x, self.data.fixed_y
        else:
            self.x, self.y = self.data.for_round(round_index)
        learning_rate = current_learning_rate(self.model.optimizer)
        metrics, train_seconds, steps = self.train_steps(k, max_steps) if k else self.train_once(max_steps)
        self.phases.add("train", round_index, time.time() - train_seconds)
        local = self.codec.flatten(self.model.get_weights(), out=self.local)
        self.maybe_inject_nan(round_index, local)
        loss = metrics.get("loss", 0.0 if not steps else math.nan)
        report = Report(self.rank, round_index, self.data.units(self.x), loss, metrics.get("accuracy", math.nan),
                        train_seconds, steps=steps, weights_finite=bool(np.isfinite(local).all()),
                        train_metrics=metrics, preempt=preemption().requested,
                        learning_rate=learning_rate)
        if not k and steps:  # k-step rounds are not timed: rebalancing is refused with them
            report.step_rate, report.timed_steps = self.step_timer.finish_round()
        return report, local

    def train_once(self, max_steps: int | None = None) -> tuple[dict[str, Any], float, int]:
        """One local epoch on the block (or ``max_steps`` batches of it); metrics, seconds, steps."""
        self.take_weights(self.global_weights)
        batch = self.cfg.train.batch_size
        x, y = self.x, self.y
        if self.data.streams:
            return self.train_streamed(max_steps)
        weights = self.sample_weights(y)
        if max_steps is not None:
            if max_steps == 0:
                return {}, 0.0, 0
            rows = np.random.default_rng(self.cfg.train.seed + self.rank).permutation(len(x))[:max_steps * batch]
            x, y = x[rows], y[rows]
            weights = None if weights is None else weights[rows]
        rng = self.shuffle_rng if self.cfg.train.shuffle else None
        return self.fit_round(fit_arguments(x, y, batch, rng, sample_weight=weights), steps_per_round(len(x), batch),
                              len(x))

    def train_streamed(self, max_steps: int | None) -> tuple[dict[str, Any], float, int]:
        """One pass over a streamed block (or ``max_steps`` batches of it); metrics, seconds, steps."""
        batch, feed = self.cfg.train.batch_size, self.x
        steps = feed.steps(batch) if max_steps is None else min(max_steps, feed.steps(batch))
        if steps == 0:
            return {}, 0.0, 0
        return self.fit_round(feed.fit_input(batch, self.shuffle_rng, max_steps), steps)  # full batches: timed

    def fit_round(self, arguments: dict[str, Any], steps: int, rows: int | None = None) -> tuple[dict[str, Any],
                                                                                                 float, int]:
        """``model.fit`` for one local epoch of ``steps`` batches (of ``rows`` samples); metrics, seconds, steps."""
        started = time.perf_counter()
        callbacks = [self.slowdown] if self.slowdown is not None else None
        callbacks = with_batch_progress(callbacks, self.cfg.log.verbosity, steps)
        self.step_timer.start_round(steps * self.cfg.train.batch_size if rows is None else rows)
        callbacks = [*(callbacks or []), self.step_timer.callback()]  # last: it times the slowdown's pause too
        history = self.model.fit(**arguments, epochs=1, verbose=0, callbacks=callbacks)
        metrics = {k: float(v[-1]) for k, v in history.history.items()}
        return metrics, time.perf_counter() - started, steps

    def train_steps(self, k: int, max_steps: int | None = None) -> tuple[dict[str, Any], float, int]:
        """``k`` steps, the round's share of the sync schedule (fewer under a ``max_steps`` budget);
        metrics, seconds, steps.

        ``train_on_batch`` runs the model's compiled train function on one batch: no
        input pipeline is built per round, and the optimizer state carries over.
        """
        self.take_weights(self.global_weights)
        steps = k if max_steps is None else min(max_steps, k)
        totals: dict[str, float] = {}
        seen = 0
        started = time.perf_counter()
        for _ in range(steps):
            rows = self.step_rows()
            x, y = self.data.batch(rows)
            for key, value in self.train_step(x, y, self.sample_weights(y, rows)).items():
                totals[key] = totals.get(key, 0.0) + float(value) * len(rows)
            seen += len(rows)
        # the round's metrics are sample-weighted means over its steps, as fit's are over an epoch
        metrics = {key: total / seen for key, total in totals.items()}
        return metrics, time.perf_counter() - started, steps

    def step_rows(self) -> np.ndarray:
        """Indices into the block of the next step's batch."""
        return self.walk.next_rows(len(self.x), self.cfg.train.batch_size)

    def train_step(self, x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> dict[str, Any]:
        return one_step(self.model, x, y, self.slowdown, weights)

    def maybe_inject_nan(self, round_index: int, local: np.ndarray) -> None:
        """Test hook (debug.nan_rank / debug.nan_round): poison this rank's weights once."""
        if self.nan_round == round_index:
            self.log.warning("debug: injecting NaN into the weights of round %d", round_index)
            local[:] = np.nan
            self.nan_round = None

    def score(self, report: Report) -> None:
        """Best-of election: score this round's weights on the shared validation split."""
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
    """One ``train_on_batch``, paused by the debug slowdown's callback when there is one."""
    if slowdown is None:
        return model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
    slowdown.on_train_batch_begin(0)
    logs = model.train_on_batch(x, y, sample_weight=weights, return_dict=True)
    slowdown.on_train_batch_end(0)
    return logs
