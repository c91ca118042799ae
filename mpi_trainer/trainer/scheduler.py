"""The scheduler's side of a round (rank 0): hand out the state, combine the workers' states by their meaning,
validate, run the callbacks, decide when to stop (:mod:`.round_protocol`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.algorithms.passes import all_finite, default_threads
from mpi_trainer.errors import RankLost, WorkerFailure
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer import shares
from mpi_trainer.trainer.epochs import EpochDriver
from mpi_trainer.trainer.round_protocol import (
    Handed,
    NonFinite,
    Order,
    Report,
    RoundClock,
    RoundPolicies,
    StateWire,
    agree_on_metric_size,
    elected,
    merged_reports,
    non_finite_cause,
)
from mpi_trainer.trainer.run_record import seed_arrays
from mpi_trainer.trainer.state import ModelState
from mpi_trainer.trainer.sync_choice import SyncChoice

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport


class RoundCombine:
    """Rank 0's combine of one round, part by part as the sum arrives (:meth:`StateWire.sum`'s ``on_part``):
    each part of the state combined by its meaning (:meth:`~.state.ModelState.combine`), checked finite,
    and its trainable positions stepped by the outer optimizer, while the part is in cache and the workers
    write the next one. ``total``, ``steps``: the workers' weights and clocks, summed before the state;
    ``seconds``: the time spent combining. ``threads``: those a part is combined on; the reduction's
    pipeline keeps a core per worker busy copying the next part meanwhile (on a 2-core node with 2 workers,
    a second thread made the round's sum and combine 1.5x slower)."""

    def __init__(self, state: ModelState, outer: Any, summed: np.ndarray, before: np.ndarray, total: float,
                 steps: np.ndarray, threads: int = 1) -> None:
        self.state, self.summed, self.before, self.total, self.steps = state, summed, before, total, steps
        self.threads = threads
        self.combines = total > 0  # a round no worker trained in cannot be combined (the scheduler says why)
        self.step = outer.begin(state.trainable_size) if outer.active and self.combines else None
        self.finite, self.seconds = True, 0.0

    def part(self, start: int, stop: int) -> None:
        if not self.combines:
            return
        began = time.perf_counter()
        summed, before = self.summed, self.before
        self.state.combine(summed, before, self.total, self.steps, start, stop)
        self.state.keep_rates(summed, before, start, stop)
        self.finite = self.finite and all_finite(summed[start:stop], threads=self.threads)
        trained = min(stop, self.state.trainable_size)
        if self.finite and self.step is not None and start < trained:
            self.step.apply(start, before[start:trained], summed[start:trained], summed[start:trained],
                            threads=self.threads)
        self.seconds += time.perf_counter() - began


class SchedulerRounds:
    """Rank 0: hands out the state, combines the workers' states, validates, runs the callbacks."""

    def __init__(self, transport: RankTransport, model: Any, state: ModelState, outer: Any, callbacks: Any,
                 validation: dict[str, Any] | None, validation_freq: Any, record: Any, bounds: Any = None,
                 policies: RoundPolicies | None = None) -> None:
        from mpi_trainer.algorithms.wait_bounds import WaitBounds

        policies = policies or RoundPolicies()
        self.transport, self.model, self.state, self.outer = transport, model, state, outer
        self.clock = RoundClock(transport, bounds or WaitBounds())
        self.callbacks, self.validation = callbacks, validation
        self.record = record
        self.buffer = np.zeros(state.size + 1 + state.clocks, dtype=np.float32)  # as the workers' (WorkerRounds)
        self.wire = policies.wire or StateWire("float32", state.model_size)  # aggregation.wire_dtype
        self.before = state.empty()  # the global state the round started from
        self.workers_hold = False  # whether the workers hold the state last broadcast (it is in the buffer)
        # between the rounds of an epoch rank 0's model lags: the combined state goes out from the buffer as it
        # is, and the model takes it (from here: the buffer, then the round's start) only when something needs
        # it: the epoch's end, a round rolled back, a rank lost (None: the model holds the state)
        self.latest: np.ndarray | None = None
        self.outer_saved: dict[str, np.ndarray] = {}  # the outer optimizer's state before the round's step
        self.held_exact = True  # whether that broadcast was exact (float32), not through a 16-bit wire
        self.workers_score = policies.workers_score  # whether the workers score the validation data
        self.preemption = policies.preemption or Preemption()  # the job's, when the fit installed its handlers
        self.driver = EpochDriver(model, callbacks, record, state, self.preemption, validation, validation_freq)
        self.preempted = False  # the run stopped for a preemption signal, checkpointed
        self.reports: list[Report] = []  # the last epoch's
        self.parts = 1  # rounds in the epoch under way
        # train.sync_every and its warm-up: the steps of the epoch's rounds (0: one round, the epoch)
        self.sync_every: Callable[[int], int] = policies.sync_every
        self.sync_choice: SyncChoice | None = policies.sync_choice  # train.sync_every = "auto": from the first round
        self.before_integers: list[np.ndarray] = []
        self.optimizers_checked = False  # whether the first trained epoch's optimizer steps were looked at
        self.elects = policies.elects  # best-of: the workers score their states and the best one is kept
        self.synchronous = policies.synchronous  # synchronous SGD: the workers hold one state, one of theirs kept
        self.test_hooks = policies.test_hooks
        self.fault: Any = policies.fault  # fault.survive: the fault settings (None: a lost rank ends the job)
        self.nan_policy = policies.nan_policy  # train.nan_policy: a non-finite round stops the fit, or trains again
        self.rollbacks = 0  # rounds rolled back in a row
        self.stop_reason: str | None = None  # why the fit ends early (non-finite, divergence), set at an epoch
        self.divergence: Any = policies.divergence  # train.divergence: a DivergenceWatch over the epochs' rows
        self.stops_on_divergence = policies.stops_on_divergence
        self.max_steps = policies.max_steps  # train.max_steps: the workers' steps, summed, that end the fit (0: none)
        self.full_steps: list[int] = policies.full_steps  # with max_steps: each worker's batches in a whole epoch
        self.steps_done = 0  # the workers' steps so far, summed (a resumed run's included)
        # rounds an epoch for so many workers at so many steps a round
        self.plan_parts: Callable[[int, int], int] = policies.plan_parts
        self.winner = 0  # best-of: the index among the workers of the last round's elected one
        self.rebalancer: Any = policies.rebalancer  # data.rebalance: the blocks, re-cut by speed (None: fixed)
        self.writes_prepared = False  # whether the buffers later writes fill are made (ModelState.prepare_writes)
        self.overlap = policies.overlap  # train.overlap_eval: the next epoch's first round trains while one is scored
        self.ahead: Handed | None = None  # that round, handed out and not yet collected
        self.epochs = 0  # the fit's epochs (set by run)
        self.seeds: list[list[np.ndarray]] = []  # each worker's seed generators' states, from its last report
        self.seeds_to_send: dict[int, list[list[np.ndarray]]] = {}  # a resumed run's, for each worker's first order

    def run(self, initial_epoch: int, epochs: int) -> dict[str, float]:
        """Every epoch from ``initial_epoch`` to ``epochs``; the last epoch's logs."""
        logs: dict[str, float] = {}
        self.epochs, reason = epochs, None
        # a resumed run's epochs so far (the record holds their rows): its steps, and the divergence seen
        self.steps_done = sum(int(float(row.get("steps") or 0)) for row in self.record.rows)
        if self.divergence is not None:
            self.divergence.start_from(self.record.rows)
        self.seeds = list(self.record.saved_seeds)  # the workers' random streams go on where the run left them
        self.seeds_to_send = {rank: self.seeds for rank in range(1, self.transport.size)} if self.seeds else {}
        self.driver.begin()
        for epoch in range(initial_epoch, epochs):
            logs = self.epoch(epoch)
            if self.driver.preempting:
                self.preempt()
                return logs
            reason = self.stop_reason or self.driver.stop_reason(False)  # ours, or a callback's stop_training
            if reason is not None:
                break
        self.drop_ahead()
        self.driver.end(logs, reason)
        # An error above reaches the workers as a failure notice (fail_together), never as a stop.
        self.send_stop()
        self.record.count_bytes(self.transport.take_bytes())
        return logs

    def preempt(self) -> None:
        """A preemption signal reached a rank: the epoch was checkpointed, and every rank leaves with
        :class:`~mpi_trainer.errors.Preempted` (the same fit on the run directory resumes from here).
        Training has not ended, so the callbacks' ``on_train_end`` does not run."""
        self.drop_ahead()
        self.preempted = True
        self.send(Order(-1, True, self.state.read_integers(), preempted=True))
        self.record.count_bytes(self.transport.take_bytes())

    def send_stop(self) -> None:
        """The job is over: the workers take the final state and leave."""
        self.send(Order(-1, True, self.state.read_integers()))

    def send(self, order: Order) -> None:
        """The order, then the state unless the workers hold it already (:attr:`Order.state_follows`)."""
        size = self.state.size
        if not order.score:
            self.clock.tick()
        in_buffer = self.latest is not None  # the last round's combined state, which the model has not taken
        if self.workers_hold:  # they hold the buffer: skip the state when the model's is the same
            order.state_follows = (not in_buffer and not self.state.holds(self.buffer[:size])) or (
                order.exact and not self.held_exact)  # scorers take the state exactly, not as a 16-bit wire has it
        self.transport.bcast_object(order)
        if order.state_follows:
            if not in_buffer:
                self.state.read(self.buffer[:size])
            self.wire.broadcast(self.transport, self.buffer[:size], exact=order.exact)
            self.held_exact = order.exact or self.wire.format.summed_by_mpi
        self.workers_hold = True

    def take_combined(self) -> None:
        """The model takes the latest combined state, if it has not yet (:attr:`latest`)."""
        if self.latest is not None:
            self.state.write(self.latest)
            self.latest = None

    def epoch(self, epoch: int) -> dict[str, float]:
        started, wall = time.perf_counter(), time.time()
        self.transport.phase = f"round {epoch}: waiting for the workers' states"
        self.driver.begin_epoch(epoch)
        times = {"comm_seconds": 0.0, "aggregate_seconds": 0.0}
        reports = self.train_epoch(epoch, times)
        self.reports = reports
        self.keep_seeds(reports)
        self.rebalance(epoch, reports)
        trained_until = time.time()
        self.steps_done += sum(report.batches for report in reports)
        if self.max_steps and self.steps_done >= self.max_steps and self.stop_reason is None:
            self.stop_reason = "max_steps"
        self.hand_out_ahead(epoch)
        combined = time.perf_counter()
        logs = self.train_logs(reports)
        logs.update(self.validate(epoch))
        scored, scored_at = time.perf_counter(), time.time()
        sent = self.transport.take_bytes() + sum(report.sent for report in reports)  # rank 0's, then the workers'
        trained = {"samples": sum(report.rows for report in reports), "workers": len(reports),
                   "steps": sum(report.batches for report in reports),
                   "winner": self.winner + 1 if self.elects else ""}  # the rows trained; best-of: the rank kept
        logs = self.driver.end_epoch(epoch, logs, reports, {"bytes": sent, **times, "eval_seconds": scored - combined,
                                                            **trained}, started,
                                     preempting=any(report.preempt for report in reports),
                                     watch=self.watch_divergence, outer=self.kept_arrays())
        self.epoch_ended()
        self.test_hooks.freeze_at(0, epoch)  # debug.freeze_rank = 0: rank 0 stops after recording this epoch
        # log.timeline: rank 0 waits while the workers train, then combines (the seconds it spent), scores and
        # checkpoints; each worker's training as it reported it
        combining = times["aggregate_seconds"]
        self.record.phases(epoch, reports, [("wait", wall, trained_until - combining),
                                            ("aggregate", trained_until - combining, trained_until),
                                            ("evaluate", trained_until, scored_at),
                                            ("checkpoint", scored_at, time.time())])
        return logs

    def train_epoch(self, epoch: int, times: dict[str, float]) -> list[Report]:
        """The epoch's rounds, combined; each worker's report of them (their seconds added to ``times``)."""
        while True:
            rounds: list[list[Report]] = []
            every = self.sync_every(epoch)
            self.parts = self.plan_parts(self.transport.size - 1, every)  # the workers left, after a loss
            try:
                for part in range(self.parts):
                    rounds.append(self.round(epoch, part, every, times))
                    self.rollbacks = 0
                return merged_reports(rounds)
            except RankLost as error:  # fault.survive: the epoch's rounds start over with the survivors
                self.carry_on(error, epoch)
            except NonFinite as error:  # the model holds the state the round started from
                if not self.roll_back(epoch, error):
                    return merged_reports(rounds + [error.reports])

    def roll_back(self, epoch: int, error: NonFinite) -> bool:
        """``train.nan_policy``: True when the epoch's rounds are to start again from the state before the round
        that went non-finite, each optimizer's learning rate halved ("rollback", up to
        :data:`~mpi_trainer.algorithms.nan_guard.MAX_CONSECUTIVE_ROLLBACKS` in a row); False when the fit stops
        there, keeping that state ("stop")."""
        from mpi_trainer.algorithms import nan_guard

        self.take_combined()  # the state the round started from
        self.workers_hold = False
        if nan_guard.decide(self.nan_policy, self.rollbacks) == nan_guard.STOP:
            self.record.log.error("epoch %d: %s; stopping (train.nan_policy=%r, %d rollbacks in a row), the model "
                                  "keeping the state the round started from", epoch, error.cause, self.nan_policy,
                                  self.rollbacks)
            self.stop_reason = "nan"
            return False
        self.rollbacks += 1
        rates = self.state.halve_rates()
        self.record.rolled_back(epoch, error.cause, rates)
        self.record.log.warning("epoch %d: %s; rolling back to the state the round started from, learning rate "
                                "halved to %s (train.nan_policy='rollback', %d in a row)", epoch, error.cause,
                                ", ".join(f"{rate:.4g}" for rate in rates) or "(a schedule: unchanged)",
                                self.rollbacks)
        return True

    def watch_divergence(self, epoch: int) -> None:
        """``train.divergence``: a finite divergence confirmed at this epoch's row is logged and kept in
        summary.json ("warn"), and ends the fit keeping the state it reached ("stop")."""
        cause = self.divergence.update(self.record.rows[-1]) if self.divergence is not None else None
        if cause is None:
            return
        self.record.divergence = {"round": epoch, "cause": cause,
                                  "action": "stopped" if self.stops_on_divergence else "warned"}
        self.record.log.warning("epoch %d: the training diverged: %s; %s", epoch, cause,
                                "stopping (train.divergence='stop')" if self.stops_on_divergence else
                                "carrying on (train.divergence='warn')")
        if self.stops_on_divergence:
            self.stop_reason = "diverged"

    def keep_seeds(self, reports: list[Report]) -> None:
        """Each worker's seed generators' states as its last report gave them (under SSP a report names its
        worker; in rounds the reports come in the workers' order)."""
        for index, report in enumerate(reports):
            worker = (report.worker or index + 1) - 1
            if report.seeds:
                self.seeds.extend([] for _ in range(worker + 1 - len(self.seeds)))
                self.seeds[worker] = report.seeds

    def kept_arrays(self) -> dict[str, np.ndarray]:
        """What a checkpoint keeps beside the state: the outer optimizer's state and the workers' seed
        generators' states."""
        return {**self.outer.state_arrays(), **seed_arrays(self.seeds)}

    def epoch_ended(self) -> None:
        """After the epoch's callbacks: nothing here (the model holds the state the next round hands out)."""

    def rebalance(self, epoch: int, reports: list[Report]) -> None:
        """``data.rebalance``: the blocks re-cut in proportion to each worker's rows a second (smoothed,
        :class:`~mpi_trainer.algorithms.rebalance.Rebalancer`); the next epoch's orders carry them."""
        from mpi_trainer.algorithms.rebalance import Measurement

        if self.rebalancer is None:
            return
        if self.rebalancer.update({index: Measurement(report.rows, report.seconds)
                                   for index, report in enumerate(reports)}):
            self.record.log.info("after epoch %d the workers' blocks were re-cut by their speed %s", epoch,
                                 self.rebalancer.describe(range(1, len(reports) + 1)))

    def carry_on(self, error: RankLost, epoch: int) -> None:
        """``fault.survive``: shrink to the surviving ranks, name the lost, and redo the epoch's rounds from the
        state the rounds so far reached (the epoch's start when a round is an epoch), each survivor on its
        share for the survivors. Below ``fault.min_workers`` the job checkpoints and ends for ``launch``."""
        if self.fault is None or not self.fault.survive:
            raise error
        while True:
            hosts = list(self.transport.hosts or [])
            shrunk = self.transport.shrink()
            for rank, world_rank in zip(shrunk.lost, shrunk.lost_world):
                host = hosts[rank] if rank < len(hosts) else "?"
                self.record.lost_worker(world_rank, host, f"round {epoch}")
            try:
                self.transport.agree(1)
                break
            except RankLost:
                continue  # another rank was lost during the shrink
        workers = self.transport.size - 1
        self.take_combined()  # the state the rounds so far reached, before a hand-out that did not complete
        self.workers_hold = False  # their buffers hold their parts of a sum that did not complete
        if workers < max(1, self.fault.min_workers):
            self.record.checkpoint(epoch, self.state, self.callbacks, force=True, outer=self.kept_arrays())
            raise WorkerFailure(f"{workers} workers left, fewer than fault.min_workers={self.fault.min_workers}; "
                                f"checkpointed before epoch {epoch} and ending the job for `launch` to restart it")
        if self.rebalancer is not None:  # the survivors start from even blocks, measured anew
            from mpi_trainer.algorithms.rebalance import Rebalancer

            self.rebalancer = Rebalancer(shares.even_bounds(self.rebalancer.total, workers), self.rebalancer.smoothing)
        self.record.log.warning("epoch %d: carrying on with %d workers, each on its share for the survivors; the "
                                "epoch's rounds start again from the state reached", epoch, workers)

    def budgets(self) -> list[int] | None:
        """``train.max_steps``: each worker's steps in the next epoch when fewer are left than a whole epoch takes
        (:func:`~mpi_trainer.algorithms.step_budget.step_budgets`), else None."""
        from mpi_trainer.algorithms.step_budget import step_budgets

        if not self.max_steps:
            return None
        budgets = step_budgets(self.max_steps - self.steps_done, dict(enumerate(self.full_steps)))
        return None if budgets is None else [budgets[index] for index in range(len(self.full_steps))]

    def round(self, epoch: int, part: int, every: int, times: dict[str, float]) -> list[Report]:
        """Hand out the state, let the workers train, combine: one round; its seconds added to ``times``
        (the combining done as the sum arrived counts as combining, not communication). The next epoch's first
        round may have been handed out already, while the last epoch was scored (:meth:`hand_out_ahead`)."""
        handed, self.ahead = self.ahead, None
        if handed is None or (handed.epoch, part) != (epoch, 0):
            handed = self.hand_out(epoch, part, every)
        else:  # its seconds so far went to scoring the last epoch
            handed.started = time.perf_counter()
        return self.collect(epoch, part, handed, times)

    def hand_out_ahead(self, epoch: int) -> None:
        """``train.overlap_eval``: the next epoch's first round handed out now, before this epoch is scored and
        its callbacks run, so that the workers train while rank 0 scores. Not after the fit's last epoch, nor
        when the fit stops here for a reason known already (a preemption signal, ``train.max_steps``)."""
        if not self.overlap or epoch + 1 >= self.epochs or self.stop_reason is not None or self.model.stop_training \
                or self.preemption.requested or any(report.preempt for report in self.reports):
            return
        every = self.sync_every(epoch + 1)
        self.parts = self.plan_parts(self.transport.size - 1, every)
        try:
            self.ahead = self.hand_out(epoch + 1, 0, every)
        except RankLost as error:  # fault.survive: the next epoch starts with the survivors, as from round()
            self.carry_on(error, epoch + 1)

    def drop_ahead(self) -> None:
        """The fit stops after an epoch that was scored while the next epoch's first round trained: the workers
        finish that round and their states are summed (the collectives they are in), and rank 0 drops the sum.
        The model keeps the scored epoch's state, and the workers take it with the order that ends the job."""
        handed, self.ahead = self.ahead, None
        if handed is None:
            return
        size, epoch = self.state.size, handed.epoch - 1
        self.workers_hold = False  # they hold the dropped sum
        try:
            if self.elects:
                self.transport.allgather(None)
            self.transport.reduce_sum(self.buffer[size:])
            self.buffer[:size] = 0.0
            self.wire.sum(self.transport, self.buffer[:size])
            self.transport.allgather(None)
        except RankLost as error:  # fault.survive: the survivors take the final state
            self.carry_on(error, handed.epoch)
        self.record.log.info("the round of epoch %d that trained while epoch %d was scored is dropped: the fit "
                             "stops after epoch %d (train.overlap_eval)", handed.epoch, epoch, epoch)

    def hand_out(self, epoch: int, part: int, every: int) -> Handed:
        """The round's order and the state, unless the workers hold it; rank 0's preparations for the sum while
        they train."""
        size = self.state.size
        self.before_integers = self.state.read_integers()
        budgets = self.budgets()
        blocks = None if self.rebalancer is None else list(self.rebalancer.bounds)
        started = time.perf_counter()
        seeds = next(iter(self.seeds_to_send.values()), None)  # to every worker at once
        self.seeds_to_send = {}
        self.send(Order(epoch, False, self.before_integers, part=part, parts=self.parts, every=every,
                        budgets=budgets, blocks=blocks, seeds=seeds))
        self.before[:] = self.buffer[:size]  # while the workers train
        if self.latest is not None:  # the model still lags: the state is kept here from now on
            self.latest = self.before
        if self.outer.active:  # the step works in place: a round that cannot be kept puts it back
            self.outer_saved = self.outer.snapshot(self.outer_saved)
        if not self.writes_prepared:  # while the workers train the first round, not in the epochs' ends
            self.state.prepare_writes()
            self.writes_prepared = True
        return Handed(epoch, budgets, started, started)

    def collect(self, epoch: int, part: int, handed: Handed, times: dict[str, float]) -> list[Report]:
        """The round's sum, combined as it arrives (the learning rates kept at the model's now: a callback may
        have set them while a round handed out ahead trained), and the workers' reports."""
        size, budgets, started = self.state.size, handed.budgets, handed.started
        self.state.read_rates(self.before)
        if self.elects:  # every worker's score, so every rank knows the winner before the sum
            self.winner = elected(self.transport.allgather(None)[1:])
        self.buffer[size:] = 0.0
        if not self.wire.format.summed_by_mpi:  # a 16-bit wire's sum adds rank 0's own state: zeros (a float32
            self.buffer[:size] = 0.0  # wire's takes the workers' sum without reading it, StateWire.sum)
        self.transport.reduce_sum(self.buffer[size:])  # the weights and clocks, then the state part by part
        combining = RoundCombine(self.state, self.outer, self.buffer[:size], self.before, float(self.buffer[size]),
                                 self.buffer[size + 1:], threads=max(1, default_threads() - self.transport.size + 1))
        returned = self.wire.sum(self.transport, self.buffer[:size], on_part=combining.part)
        self.workers_hold = False  # until the round is kept: what came back may not be finite
        reports: list[Report] = self.transport.allgather(None)[1:]
        collected = time.perf_counter()
        self.combine(epoch, reports, combining, some_may_rest=self.parts > 1 or budgets is not None,
                     last=part == self.parts - 1)
        if returned:  # the combined state came back to every worker with the sum: the next round need not send it
            self.workers_hold = self.held_exact = True
        times["comm_seconds"] += collected - started - combining.seconds
        times["aggregate_seconds"] += time.perf_counter() - collected + combining.seconds
        if self.sync_choice is not None:
            said = self.sync_choice.observe(reports, time.perf_counter() - handed.sent)  # the workers' whole round
            if said:
                self.record.log.info("%s", said)
        return reports

    def combine(self, epoch: int, reports: list[Report], combining: RoundCombine, some_may_rest: bool = False,
                last: bool = True) -> None:
        """The round's combine, finished: the state was combined by meaning and the trainable part stepped by
        the outer optimizer as the sum arrived (:class:`RoundCombine`); kept unless something is not finite.
        The model takes it now when the epoch's rounds are over (``last``); between them it goes out from the
        buffer and the model lags (:attr:`latest`)."""
        total, steps = combining.total, combining.steps
        empty = [rank + 1 for rank, report in enumerate(reports) if not report.batches]
        if (empty and not some_may_rest) or total <= 0:  # a worker past its last rows rests in a round
            self.put_back_outer()
            self.take_combined()
            raise RuntimeError(f"worker rank(s) {empty} trained no batch in epoch {epoch}: their share of the "
                               f"input is empty (a dataset shorter than one batch per worker, or an exhausted "
                               f"generator); give every worker data, or fewer workers")
        self.check_optimizers_stepped(epoch, steps)
        cause = non_finite_cause(reports, combining.finite)
        if cause:
            self.put_back_outer()
            raise NonFinite(cause, reports)
        self.latest = self.buffer[:self.state.size]
        if last:
            self.take_combined()
        if self.synchronous:  # the state kept is the first of those workers' that took every step
            batches = [report.batches for report in reports]
            self.winner = batches.index(max(batches))
        kept = reports[self.winner if self.elects or self.synchronous else 0].integers  # other than step counts
        self.state.write_integers(self.state.combine_integers(self.before_integers, kept, steps))

    def put_back_outer(self) -> None:
        """The outer optimizer's state as it was before a round that is not kept."""
        if self.outer.active:
            self.outer.restore(self.outer_saved)

    def check_optimizers_stepped(self, epoch: int, steps: np.ndarray) -> None:
        """Say so once when the workers trained but no optimizer the state holds took a step: the model
        steps through an optimizer it keeps out of sight (in a list, a closure), whose moments stay per worker."""
        if self.optimizers_checked or steps[0] <= 0:
            return
        self.optimizers_checked = True
        if not np.any(steps[1:] > 0):
            names = [type(optimizer).__name__ for optimizer in self.state.optimizers]
            self.record.warn(f"epoch {epoch}: the workers trained {int(steps[0])} batches but none of the model's "
                             f"optimizers found ({', '.join(names) or 'none'}: model.optimizer and optimizer "
                             f"attributes of the model and its layers) took a step; the optimizer it steps with is "
                             f"not moved between ranks, so its moments stay each worker's own")

    def train_logs(self, reports: list[Report]) -> dict[str, float]:
        """The epoch's training logs: each worker's Keras logs, averaged by the rows it trained."""
        rows = sum(report.rows for report in reports)
        names = sorted({name for report in reports for name in report.logs})
        return {name: sum(r.logs.get(name, math.nan) * r.rows for r in reports) / rows for name in names}

    def validate(self, epoch: int) -> dict[str, float]:
        if not self.driver.due(epoch, last=self.stop_reason == "max_steps"):  # a fit's last epoch is scored
            return {}
        if not (self.elects or self.workers_score):
            return self.driver.score()
        # best-of: the combined state is the elected worker's, and its scores are the epoch's
        scores = self.reports[self.winner].scores if self.elects else self.score_on_workers(epoch)
        return {f"val_{name}": float(value) for name, value in scores.items()}

    def score_on_workers(self, epoch: int) -> dict[str, float]:
        """The combined state scored by the workers, each on its share; their metric states summed here and
        read as Keras reads them (exact for metrics whose state is a sum: means, counts, confusion counts)."""
        from mpi_trainer.models.metric_state import metric_state, metrics_from_flat

        if not all(getattr(metric, "built", True) for metric in self.model.metrics):  # built by a first batch
            self.model.evaluate(**{**(self.validation or {}), "steps": 1}, verbose=0)
        self.send(Order(epoch, False, self.state.read_integers(), score=True))
        summed = np.zeros(sum(part.size for part in metric_state(self.model)), dtype=np.float64)
        agree_on_metric_size(self.transport, summed.size)
        self.transport.reduce_sum(summed)
        return metrics_from_flat(self.model, summed)
