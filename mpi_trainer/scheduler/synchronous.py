"""The synchronous engine (``aggregation.ssp = 0``): every worker trains every round, on the same weights.

Separation of concerns: this engine decides when workers run and what they
get: each round's orders (block bounds after a re-cut, a step budget under
``train.max_steps``, a new learning rate after a NaN rollback), the weights
broadcast, and the collection (one sum-reduction for ``average`` /
``weighted``, scores then the winner's weights for ``best``: its
:class:`~mpi_trainer.scheduler.sync_collection.RoundCollector`). It re-cuts
blocks by throughput (``data.rebalance``), runs the next round during the
evaluation (``train.overlap_eval``) and gathers optimizer state for
checkpoints. It applies the outer optimizer to each round's aggregate before
anything reads it, scores the result and hands the finished round to the
:class:`~mpi_trainer.scheduler.recorder.RoundRecorder`, which writes it down. Under
``fault.survive`` a worker lost during a round (:class:`~mpi_trainer.errors.RankLost`)
leaves the survivors to redo that round from its starting weights on blocks
re-planned for them (:meth:`Engine.survive_loss`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.outer_optimizer import OuterStep
from mpi_trainer.algorithms.passes import all_finite
from mpi_trainer.algorithms.rebalance import Rebalancer, measured
from mpi_trainer.algorithms.staleness import idle_fraction
from mpi_trainer.algorithms.step_budget import step_budgets, steps_per_round
from mpi_trainer.comm.protocol import JobPlan, Report, RoundOrder, SchedulerLink
from mpi_trainer.config import Config
from mpi_trainer.data.increment import log_data_shares
from mpi_trainer.data.placement import ScatterLedger
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import RankLost
from mpi_trainer.persistence.checkpoint import CheckpointArray, StoredArray, StreamedArray
from mpi_trainer.persistence.optimizer_state import assign_states
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_record import NO_CONTEXT, RunContext, StopReason
from mpi_trainer.scheduler.engine import Engine
from mpi_trainer.scheduler.evaluation import Evaluator, make_evaluator
from mpi_trainer.scheduler.round_row import ClosedRound, Outcome, Retry
from mpi_trainer.scheduler.sync_collection import RoundCollector


class SynchronousEngine(Engine):
    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        super().__init__(link, cfg, dataset, model, plan, run_dir, hosts, resume, context)
        # what the next round's orders carry: a NaN rollback's or a resume's rate, a reset of the workers' optimizers
        self.next_rate: float | None = None
        self.reset_next = False
        self.pending_states: dict[int, np.ndarray | StoredArray] = {}  # a resume's, sent with the first round
        self.next_started: float | None = None  # set while the next round runs ahead (overlap_eval)
        self.collector = RoundCollector(link, self.wire, self.codec.size, self.watchdog, self.observers, self.log,
                                        cfg.aggregation.elects)
        self.rebalancer = Rebalancer(plan.block_bounds, cfg.data.rebalance_smoothing) if cfg.data.rebalance else None
        # Under scatter a re-cut moves rows: the ledger knows who holds what, ``moved`` what goes next.
        # (fault.survive: a lost worker's rows go to the survivors.)
        self.ledger = (ScatterLedger(cfg, plan, self.workers)
                       if (cfg.data.rebalance or cfg.fault.survive) and cfg.data.scatters else None)
        self.replanned = False  # fault.survive: the next orders carry the blocks re-planned for the survivors
        self.moved: dict[int, np.ndarray] = {}
        if resume is not None:
            self.resume_from(resume)
        self.warn_inside_warmup()

    def make_evaluator(self) -> Evaluator:
        """The evaluator ``evaluation.where`` asks for (the workers may score the global model)."""
        return make_evaluator(self.cfg, self.dataset, self.model, self.codec, self.link, self.watchdog)

    def resume_from(self, resume: ResumeState) -> None:
        self.pending_states = assign_states(resume.optimizer_states, self.workers)
        if resume.lr_scale != 1.0:
            self.next_rate = self.recorder.learning_rate
        self.log.info("resuming after round %d (%d steps so far); %d workers now, %d before%s",
                      resume.next_round - 1, resume.steps, len(self.workers), resume.previous_workers,
                      "" if resume.previous_workers == len(self.workers) else ": blocks re-planned")

    def describe(self) -> str:
        """The engine's line, with the outer optimizer and the sync schedule's phases when there is a warm-up."""
        schedule, line = self.schedule, super().describe()
        if self.outer.active:
            line = f"{line}; {self.outer.settings.describe()}"
        if not schedule.warmup_rounds:
            return line
        return f"{line}; sync schedule: {schedule.describe()}"

    def warn_inside_warmup(self) -> None:
        """``train.epochs`` counts rounds, and a warm-up's rounds are a step each: say when it never ends."""
        warmup, epochs = self.schedule.warmup_rounds, self.cfg.train.epochs
        if 0 < epochs <= warmup:
            self.log.warning("train.epochs=%d rounds end inside the sync warm-up of %d rounds "
                             "(train.sync_warmup_epochs=%d); train.epochs > %d trains past it", epochs, warmup,
                             self.cfg.train.sync_warmup_epochs, warmup)

    # -- the rounds -------------------------------------------------------------
    def run_rounds(self) -> StopReason:
        round_index = self.recorder.start_round
        while round_index < self.cfg.train.epochs:
            if self.recorder.steps_exhausted():
                return StopReason.MAX_STEPS
            outcome = self.run_surviving(round_index)
            if outcome is Retry.ROUND:
                continue
            round_index += 1
            if outcome is not None:
                return outcome
        return StopReason.EPOCHS

    def run_surviving(self, round_index: int) -> Outcome:
        """One round; when a worker is lost in it, the survivors train it again from its starting weights.

        A loss surfaces before the round is recorded (in its orders, broadcast, reports or
        collection), so nothing of the interrupted round reaches the global model or rounds.csv.
        """
        if not self.cfg.fault.survive:  # a loss ends the job: the round's starting weights need not outlive it
            return self.run_round(round_index)
        before, steps = self.weights, self.state.steps
        # the outer step updates its state in place: a loss after it must not count the round twice
        outer_state = self.outer.snapshot()
        try:
            return self.run_round(round_index)
        except RankLost as error:
            # under train.overlap_eval the next round may have been handed out: it is dropped with this one
            self.weights, self.state.steps, self.next_started = before, steps, None
            self.outer.restore(outer_state)
            self.recorder.count_bytes(self.link.take_bytes())  # the lost round's traffic: in the total only
            if self.ledger is not None:
                self.ledger.doubt()
            self.survive_loss(error, round_index, f"round {round_index}")
            self.log.warning("round %d: trained again by %d workers from its starting weights", round_index,
                             len(self.workers))
            return Retry.ROUND

    def run_round(self, round_index: int) -> Outcome:
        """One synchronous round; returns a stop reason, a retry after a NaN rollback, or None."""
        started = self.next_started if self.next_started is not None else self.dispatch(round_index)
        self.next_started = None
        closed = self.collector.reports(started, round_index, self.workers)
        cause = self.non_finite_cause(closed.reports)
        combined = self.combine(closed, step=cause is None)
        collected = time.perf_counter()
        cause = cause or combined.cause
        if cause:
            return self.on_non_finite(round_index, cause, combined.before, closed.bytes)
        self.weights = combined.out
        del combined  # without fault.survive nothing else holds the weights the round started from
        self.state.steps += sum(r.steps for r in closed.reports)
        log_data_shares(self.log, self.cfg.data.increment, round_index, closed.reports, self.plan.num_train)
        closed.bytes += self.link.take_bytes()  # this round's bytes, before the next one starts
        self.rebalance(round_index, closed.reports)
        if self.overlaps(round_index):
            # The workers train the next round while this one is evaluated and recorded.
            self.next_started = self.dispatch(round_index + 1)
        finished = self.score(closed)
        finished.row.update(self.timing(closed, started, collected))
        stop = self.record(finished)
        self.pace(round_index)
        if stop:
            self.drain_next(round_index + 1)
            return stop
        return StopReason.MAX_STEPS if self.recorder.steps_exhausted() else None

    def combine(self, closed: ClosedRound, step: bool) -> CombinedRound:
        """The round's aggregate (average, weighted or elected), taken part by part as it arrives, and the outer
        optimizer's step from the weights the round started from (``none``: the aggregate itself) into the next
        global weights: before the next round is dispatched and before the evaluation, so the workers train and
        score the result. ``step`` False (the reports already failed the round): the aggregate is drained unused.

        The step writes into the global weights in place, so the round's aggregate never exists whole beside
        them; under ``fault.survive`` into a new buffer, since a worker lost during the round leaves the
        survivors to train it again from the weights it started from."""
        before = self.weights
        out = np.empty_like(before) if self.cfg.fault.survive else before
        combined = CombinedRound(self.outer.begin(before.size) if step else None, before, out)
        self.collector.weights(closed, self.workers, combined.take)
        closed.aggregate_seconds += combined.seconds
        return combined

    def timing(self, closed: ClosedRound, started: float, collected: float) -> dict[str, Any]:
        """The round's wall, communication and idle columns, asked for once its evaluation ended (the wall
        ends where the next round began, when it runs ahead)."""
        ended = self.next_started if self.next_started is not None else time.perf_counter()
        wall, train_max = ended - started, max(r.train_seconds for r in closed.reports)
        return {"wall_seconds": wall,
                "comm_seconds": max(0.0, collected - started - train_max - closed.aggregate_seconds),
                "idle_fraction": idle_fraction(wall, {r.rank: r.train_seconds for r in closed.reports}),
                "block_sizes": ";".join(str(r.samples) for r in closed.reports)}

    def on_non_finite(self, round_index: int, cause: str, before: np.ndarray | None, received: int) -> Outcome:
        """The NaN policy; a rerun round's orders carry the halved rate and reset the workers' optimizers."""
        outcome, self.weights = self.apply_nan_policy(round_index, cause, before, received)
        if outcome is Retry.ROUND:
            self.next_rate, self.reset_next = self.recorder.learning_rate, True
        return outcome

    def overlaps(self, round_index: int) -> bool:
        """Whether the next round starts before this one is evaluated (train.overlap_eval).

        Not before a checkpoint: gathering the workers' optimizer state needs them idle.
        """
        return (self.cfg.train.overlap_eval and round_index + 1 < self.cfg.train.epochs
                and not self.recorder.checkpoint_due(round_index) and not self.recorder.steps_exhausted())

    def drain_next(self, round_index: int) -> None:
        """Early stop with the next round already running: take its results in and discard them."""
        if self.next_started is None:
            return
        started, self.next_started = self.next_started, None
        closed = self.collector.collect(started, round_index, self.workers, discard)
        self.recorder.count_bytes(self.link.take_bytes() + closed.bytes)
        self.log.info("round %d was already under way when early stopping decided; its result is discarded",
                      round_index)

    # -- handing out a round ------------------------------------------------------
    def round_orders(self, round_index: int) -> dict[int, RoundOrder]:
        """Each worker's order, with a step budget when train.max_steps ends the run mid-round."""
        budgets = None
        if self.cfg.train.max_steps:
            budgets = step_budgets(self.cfg.train.max_steps - self.state.steps, self.full_round_steps(round_index))
        orders, held = {}, self.evaluator.holds(self.weights_version)
        # a NaN rollback's halved rate, else the one a Keras callback set on the scheduler's optimizer
        rate = self.recorder.callback_rate if self.next_rate is None else self.next_rate
        for worker in self.workers:
            orders[worker] = RoundOrder(
                round_index, learning_rate=rate, reset_optimizer=self.reset_next,
                optimizer_state=worker in self.pending_states,
                max_steps=None if budgets is None else budgets[worker], held_weights=held,
                blocks=list(self.plan.block_bounds) if self.rebalancer or self.replanned else None,
                moved_rows=len(self.moved[worker]) if self.moved else None)
        self.next_rate, self.reset_next, self.replanned = None, False, False
        return orders

    def full_round_steps(self, round_index: int) -> dict[int, int]:
        """Each worker's steps in a whole round: the sync schedule's k, or one local epoch of its block."""
        k, batch = self.schedule.steps(round_index), self.cfg.train.batch_size
        return {worker: k or steps_per_round(end - start, batch)
                for worker, (start, end) in zip(self.workers, self.plan.block_bounds)}

    def dispatch(self, round_index: int) -> float:
        """Start a round on every worker (orders, moved rows, state, "ready", weights); returns when."""
        started = time.perf_counter()
        for worker, order in self.round_orders(round_index).items():
            self.send_order(worker, order)
            if self.moved:
                self.send_moved(worker, round_index)
        self.moved = {}
        for worker, vector in self.pending_states.items():
            self.link.send_state(worker, vector)
        self.pending_states = {}
        if not self.evaluator.holds(self.weights_version):
            # the broadcast's arrival messages name a worker that stopped before it
            self.send_weights(round_index)
        else:  # the workers scored these weights and kept them: only "ready" says they are there
            try:
                self.link.await_ready(self.watchdog.deadline(started))
            except TimeoutError as exc:
                raise self.watchdog.timed_out(f"start round {round_index}", exc, self.workers) from None
        if self.ledger is not None:
            self.ledger.confirm()  # the broadcast (or "ready") came from every worker: each took its rows
        self.observers.span("send", round_index, started)
        return started

    def send_weights(self, round_index: int) -> None:
        try:
            self.link.broadcast_global(self.weights, self.wire, self.watchdog.timeout)
        except TimeoutError as exc:
            raise self.watchdog.timed_out(f"take the weights of round {round_index}", exc, self.workers) from None

    def send_moved(self, worker: int, round_index: int) -> None:
        """Scatter: the rows that changed owner go to their new worker before it reads its block."""
        self.hand_over_rows(worker, self.moved[worker], round_index)

    def rebalance(self, round_index: int, reports: list[Report]) -> None:
        """Re-cut the blocks from this round's throughput; the next round's orders carry the new bounds."""
        if self.rebalancer is None:
            return
        rates = {r.rank - 1: measured(r) for r in reports}
        if self.rebalancer.update(rates):
            self.adopt_bounds(round_index + 1)
            self.log.info("after round %d blocks re-cut by throughput %s", round_index,
                          self.rebalancer.describe(self.workers))

    def adopt_bounds(self, start_round: int) -> None:
        """The new blocks, and under scatter the rows that change owner, go out with the next orders."""
        super().adopt_bounds(start_round)
        if self.ledger is not None:
            self.moved = self.ledger.recut(self.plan, start_round)

    def renumber(self, survivors: list[int]) -> None:
        if self.ledger is not None:
            self.ledger.held = {new: self.ledger.held[old] for new, old in enumerate(survivors) if new}

    def replan(self, next_round: int) -> None:
        """Blocks for the survivors; under scatter the rows they now lack go from rank 0 with the orders."""
        super().replan(next_round)
        self.replanned, self.pending_states = True, {}
        if self.ledger is not None:
            self.moved = self.ledger.recut(self.plan, next_round)

    # -- optimizer state for checkpoints ---------------------------------------------
    def optimizer_states(self, after_round: int) -> Mapping[int, CheckpointArray]:
        """Each worker's optimizer vector, for the checkpoint after ``after_round``, asked of the worker as
        the checkpoint reads it and written as it arrives; none after a NaN (it may hold NaN)."""
        if self.state.stop_reason == StopReason.NAN:
            return {}
        return WorkerStates(self.workers, self.request_state)

    def request_state(self, worker: int) -> StreamedArray:
        """One worker's optimizer vector, arriving message by message (a lost worker raises
        :class:`RankLost` under ``fault.survive``)."""
        try:
            incoming = self.link.request_state(worker, self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure("send its optimizer state", [worker]) from None

        def deliver(take: Callable[[np.ndarray], None]) -> None:
            try:
                received = self.link.receive_state(incoming, take, self.watchdog.timeout)
            except TimeoutError:
                raise self.watchdog.failure("send its optimizer state", [worker]) from None
            # Checkpoint traffic is counted in the run's total, not in the round's row.
            sent = self.link.take_bytes() + received
            self.state.checkpoint_bytes += sent
            self.recorder.count_bytes(sent)

        return StreamedArray(int(np.prod(incoming.shape, dtype=np.int64)), incoming.dtype, deliver)


class WorkerStates(Mapping[int, CheckpointArray]):
    """The workers' optimizer vectors by rank, each asked of its worker when it is read and written as it
    arrives: a checkpoint holds one message of one at a time (under Adam each is twice the model)."""

    def __init__(self, workers: Sequence[int], request: Callable[[int], StreamedArray]) -> None:
        self.workers, self.request = list(workers), request

    def __getitem__(self, worker: int) -> StreamedArray:
        if worker not in self.workers:
            raise KeyError(worker)
        return self.request(worker)

    def __iter__(self) -> Iterator[int]:
        return iter(self.workers)

    def __len__(self) -> int:
        return len(self.workers)


def discard(start: int, values: np.ndarray) -> None:
    """Take a part of a round's aggregate and keep nothing (a round already under way when the run stopped)."""


class CombinedRound:
    """The next global weights, made part by part as a round's aggregate arrives (:meth:`take`).

    Each part is checked finite, then ``step`` (the round's :class:`OuterStep`; None: the round failed
    already and its aggregate is drained unused) writes it into ``out``, which may be ``before`` itself.
    After a non-finite part nothing more is written. ``seconds``: the time spent combining.
    """

    def __init__(self, step: OuterStep | None, before: np.ndarray, out: np.ndarray) -> None:
        self.step, self.out, self._before = step, out, before
        self.cause: str | None = None
        self.written = False  # whether ``out`` was changed
        self.seconds = 0.0

    def take(self, start: int, values: np.ndarray) -> None:
        if self.step is None or self.cause is not None:
            return
        began = time.perf_counter()
        stop = start + values.size
        if all_finite(values):
            self.step.apply(start, self._before[start:stop], values, self.out[start:stop])
            self.written = True
        else:
            self.cause = "non-finite aggregated weights"
        self.seconds += time.perf_counter() - began

    @property
    def before(self) -> np.ndarray | None:
        """The weights the round started from, or None where the step has written over part of them."""
        return None if self.written and self.out is self._before else self._before
