"""The worker's side of a round: take the state, train one epoch (or a round's steps) of its share with the
model's own ``fit``, report; score its share of the validation data when told to (:mod:`.round_protocol`)."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.errors import Preempted, RankLost, WorkerFailure
from mpi_trainer.hooks import TestHooks
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer import shares
from mpi_trainer.trainer.round_protocol import (
    Order,
    Report,
    RoundClock,
    StateWire,
    agree_on_metric_size,
    array_pipeline,
    elected,
    election_score,
    reusable_input,
)
from mpi_trainer.trainer.slowdown import make_slowdown
from mpi_trainer.trainer.state import ModelState, finalization_held
from mpi_trainer.trainer.sync_choice import median_step
from mpi_trainer.trainer.synchronous import GradientSum

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport


class _BatchCounter:
    """Counts and times the batches of one ``fit`` call (a dataset's length is not known in advance)."""

    def __init__(self) -> None:
        import keras

        counter = self

        class Counting(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
                counter.began = time.perf_counter()

            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                counter.batches += 1
                counter.durations.append(time.perf_counter() - counter.began)

        self.batches, self.began = 0, 0.0
        self.durations: list[float] = []
        self.callback = Counting()


@dataclass
class WorkerPart:
    """A worker's part of the fit's data: its share (``model.fit``'s arguments) and rows, its share of the
    validation data to score, the validation data to stand for election with (best-of), the rows its
    ``data.increment`` draws come from, and the order ``data.rebalance`` deals rows in."""

    share: dict[str, Any]
    rows: int | None
    validation: dict[str, Any] | None = None
    election: dict[str, Any] | None = None
    increment: tuple[Any, np.ndarray, Any] | None = None  # (every training row, its fixed rows, the settings)
    dealt: tuple[Any, np.ndarray] | None = None  # (every training row, the order they are dealt in)


class WorkerRounds:
    """A worker: takes the state, trains one epoch of its share with ``model.fit``, reports; scores its share
    of the validation data with ``model.evaluate`` when told to."""

    def __init__(self, transport: RankTransport, model: Any, state: ModelState, share: dict[str, Any], rows: int | None,
                 weighted: bool, bounds: Any = None, validation: dict[str, Any] | None = None,
                 gradients: GradientSum | None = None, *, part: WorkerPart | None = None,
                 preemption: Preemption | None = None, wire: StateWire | None = None, augmenter: Any = None,
                 reshare: Callable[[], WorkerPart] | None = None, test_hooks: TestHooks | None = None) -> None:
        """``share``, ``rows``, ``validation``: this worker's part of the data, or all of it as ``part``;
        ``reshare``: after a rank is lost (``fault.survive``), this worker's part for the survivors (None: the
        lost rank ends the job); ``gradients``: synchronous SGD's per-step sum; ``test_hooks``: the faults and
        slowness a test or benchmark asked of this worker (the config's ``test_hooks``; None: none)."""
        from mpi_trainer.algorithms.wait_bounds import WaitBounds

        self.transport, self.model, self.state = transport, model, state
        self.clock = RoundClock(transport, bounds or WaitBounds(), None if gradients is None else gradients.workers)
        self.share: dict[str, Any] = {}  # model.fit's arguments for this worker's share
        self.validation: dict[str, Any] | None = None  # model.evaluate's arguments for its share of the validation
        self.scoring: dict[str, Any] | None = None  # that share as this worker scores it (reusable_input)
        self.election: dict[str, Any] | None = None  # best-of: model.evaluate's arguments for the validation data
        # data.increment: (every training row, this worker's fixed rows, the settings); each epoch adds a draw
        self.increment: tuple[Any, np.ndarray, Any] | None = None
        self.reshare = reshare
        self.test_hooks = test_hooks = test_hooks or TestHooks()  # slow batches, a crash, a freeze, NaN
        self.slowdown = make_slowdown(test_hooks, transport.rank)
        self.crash_at = ((test_hooks.crash_round, test_hooks.crash_phase)
                         if test_hooks.crash_rank and test_hooks.crash_rank == transport.world_rank else None)
        # debug.nan_rank / nan_round: this worker's part of that epoch's sum is poisoned once
        self.nan_at = test_hooks.nan_round if test_hooks.nan_rank and test_hooks.nan_rank == transport.rank else None
        self.preemption = preemption or Preemption()  # the job's, when the fit installed its signal handlers
        self.augmenter = augmenter  # data.augmentation: Keras' random image layers, applied to each round's rows
        # data.rebalance: (every training row, the order they are dealt in), and the part of it this worker holds
        self.dealt: tuple[Any, np.ndarray] | None = None
        self.block: tuple[int, int] | None = None
        self.order, self.order_epoch = np.arange(0), -1  # the epoch's order of the share's rows
        self.served: int | None = None  # the epoch of the last order taken
        self.waited: tuple[float, float] | None = None  # when this worker began and ended waiting for it
        self.rows = rows  # the rows of the share (arrays); None: counted from the batches
        self.take_part(part or WorkerPart(share, rows, validation))
        self.weighted = weighted
        # the state, then this worker's weight, then its count of each clock (the model's steps, each
        # optimizer's): summed over the workers in one reduction
        self.buffer = np.zeros(state.size + 1 + state.clocks, dtype=np.float32)
        self.wire = wire or StateWire("float32", state.model_size)  # aggregation.wire_dtype
        self.gradients = gradients  # synchronous SGD: the step's gradients summed with the other workers'

    def run(self) -> None:
        """Carry out the scheduler's orders until it says stop."""
        if self.gradients is None:
            self.serve_all()
            return
        with self.gradients.installed():
            self.serve_all()

    def serve_all(self) -> None:
        while True:
            try:
                if not self.serve():
                    return
            except RankLost as error:  # fault.survive: the survivors carry on; else the job ends
                self.rejoin(error)

    def rejoin(self, error: RankLost) -> None:
        """``fault.survive``: a rank was lost. Carry on with the survivors under this worker's new rank, with
        its share of the rows for the survivors (:attr:`reshare`); the scheduler redoes the epoch's rounds."""
        if self.reshare is None:
            raise error
        while True:
            self.transport.shrink()
            if self.transport.world_ranks[0] != 0:
                raise WorkerFailure("the scheduler (rank 0) was lost; ending the job for `launch` to restart it")
            try:
                self.transport.agree(1)
                break
            except RankLost:
                continue  # another rank was lost during the shrink
        self.order_epoch = -1  # the walk through the rows follows the new share
        self.take_part(self.reshare())

    def take_part(self, part: WorkerPart) -> None:
        """This worker's part of the data (at the start, and for the survivors after a rank is lost)."""
        self.share, self.rows, self.validation, self.election = part.share, part.rows, part.validation, part.election
        self.scoring = None
        self.increment, self.dealt, self.block = part.increment, part.dealt, None

    def serve(self) -> bool:
        """One order: take the state, then train, score or stop; False once the order is to stop."""
        size = self.state.size
        self.transport.phase = self.awaiting_order()
        waiting = time.time()
        order: Order = self.transport.bcast_object(None)
        self.served, self.waited = order.epoch, (waiting, time.time())
        if not order.score:
            self.clock.tick()
        if order.state_follows:  # else the model holds what came back with the last sum (WorkerRounds.train_round)
            self.wire.broadcast(self.transport, self.buffer[:size], exact=order.exact)
            self.state.write(self.buffer[:size])
        self.state.write_integers(order.integers)
        self.take_seeds(order)
        if order.stop and order.preempted:
            raise Preempted()
        if order.stop:
            return False
        if order.score:
            self.score()
            return True
        self.train_round(order)
        return True

    def take_seeds(self, order: Order) -> None:
        """A resumed run's first order: this worker's seed generators go on from where the checkpoint kept
        them, so that it draws the masks and noise an uninterrupted run would."""
        index = self.transport.rank - 1
        if order.seeds is not None and index < len(order.seeds) and len(order.seeds[index]) == len(self.state.seeds):
            self.state.write_seeds(order.seeds[index])

    def awaiting_order(self) -> str:
        """What this worker waits for, named when the wait runs out."""
        after = "before the first round" if self.served is None else f"after round {self.served}"
        return f"waiting for the scheduler's next order ({after})"

    def train_round(self, order: Order) -> None:
        """Train the round the order names, then add this worker's state to the sum and report."""
        size = self.state.size
        self.test_hooks.freeze_at(self.transport.rank, order.epoch)  # debug.freeze_rank: this worker stops here
        self.maybe_crash(order.epoch, "train")
        began = self.state.optimizer_steps()
        report = self.train_order(order)
        if self.gradients is not None:
            self.gradients.drain()  # the others' last steps, where this worker's share ran out first
        steps = [report.batches] + [now - then for now, then in zip(self.state.optimizer_steps(), began)]
        weight = float(report.rows if self.weighted else 1) if report.batches else 0.0
        if self.election is not None:
            weight = self.stand(report)
        elif self.gradients is not None:  # every worker holds the same state: one of those with every step
            weight = 1.0 if self.gradients.keeps(report.batches) else 0.0
        if weight or (self.election is None and self.gradients is None):
            self.state.contribute(self.buffer[:size], weight, steps)
        else:  # best-of, not elected (synchronous SGD, not kept): this worker adds nothing to the sum
            self.buffer[:] = 0.0
            steps = [0] * len(steps)
        self.buffer[size] = weight
        self.buffer[size + 1:] = steps
        if self.nan_at == order.epoch:
            self.buffer[:size] = np.nan
            self.nan_at = None
        self.maybe_crash(order.epoch, "contribute")
        self.transport.reduce_sum(self.buffer[size:])  # weight and clocks first: rank 0 combines as the state comes
        # the combined state is written into the model as it comes back, while later parts are summed; a round
        # rank 0 does not keep is undone by the next order, which then carries the state (Order.state_follows)
        writing = self.state.arriving(self.buffer[:size])
        if self.wire.sum(self.transport, self.buffer[:size], on_returned=writing):
            writing(0, size)  # whatever is left, where the transport said less of what arrived
        report.preempt = self.preemption.requested
        report.sent = self.transport.take_bytes()
        if self.gradients is not None:
            report.sent += self.gradients.workers.take_bytes()  # the step's sums
        report.sent += len(pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)) * (self.transport.size - 1)
        self.transport.allgather(report)

    def train_order(self, order: Order) -> Report:
        """The training the order asks of this worker: k steps of its rows (``train.sync_every``), an epoch of
        its share (with ``data.increment``'s draw), or the steps ``train.max_steps`` left it."""
        if order.blocks is not None:
            self.take_block(order.blocks[self.transport.rank - 1])
        budget = None if order.budgets is None else order.budgets[self.transport.rank - 1]
        if budget == 0:  # the steps left went to other workers
            return Report({}, 0, 0, 0.0, self.state.read_integers())
        if order.parts > 1:
            return self.train_part(order.epoch, order.part, order.every)
        share, rows = self.increment_share(order.epoch)
        if budget is not None:
            share = {**(share or self.share), "steps_per_epoch": budget}
            rows = min(budget * (self.share.get("batch_size") or 32), int(rows or self.rows or 0)) or None
        return self.train(order.epoch, share, rows)

    def take_block(self, block: tuple[int, int]) -> None:
        """``data.rebalance``: this worker's share becomes the rows of ``block`` in the dealing order."""
        if block == self.block or self.dealt is None:
            return
        data, dealing = self.dealt
        index = np.sort(dealing[block[0]:block[1]])
        x, y, weights = (None if part is None else shares.take_rows(part, index) for part in data)
        self.share = {**self.share, "x": x, "y": y, "sample_weight": weights}
        self.rows, self.block = len(index), block

    def maybe_crash(self, epoch: int, phase: str) -> None:
        """Test hook (``debug.crash_rank``, ``crash_round``, ``crash_phase``): end this rank as kill -9 would."""
        if self.crash_at == (epoch, phase):
            hooks.end_rank(self.transport)

    def stand(self, report: Report) -> float:
        """Best-of: score this worker's state on the validation data; every rank learns every score and so the
        winner (:func:`elected`). Its weight: 1 when elected (its state becomes the combined one), else 0."""
        if report.batches:  # a worker past its last rows (train.sync_every) stands with no state of its own
            report.scores = {name: float(value) for name, value in
                             self.model.evaluate(**(self.election or {}), verbose=0, return_dict=True).items()}
        scores = self.transport.allgather(election_score(report.scores) if report.batches else None)[1:]
        return 1.0 if elected(scores) == self.transport.rank - 1 else 0.0

    def score(self) -> None:
        """This worker's share of the validation data, scored by Keras; the metrics' state summed on rank 0."""
        from mpi_trainer.models.metric_state import flat_metric_state, metric_state

        if self.validation is None:
            raise RuntimeError("told to score, but this worker holds no share of the validation data")
        if self.scoring is None:
            self.scoring = reusable_input(self.validation)
        self.model.evaluate(**self.scoring, verbose=0)
        vector = flat_metric_state(metric_state(self.model))
        agree_on_metric_size(self.transport, vector.size)
        self.transport.reduce_sum(vector)

    def train(self, epoch: int, share: dict[str, Any] | None = None, rows: int | None = None) -> Report:
        """One ``model.fit`` epoch over ``share`` (default: the whole share of the input)."""
        from mpi_trainer.data.augmentation import augment

        counter = _BatchCounter()
        started = time.perf_counter()
        share = share or self.share
        if self.augmenter is not None:  # a freshly transformed copy of the round's images; the input stays as it is
            share = {**share, "x": augment(share["x"], self.augmenter)}
        callbacks = [counter.callback] + ([self.slowdown] if self.slowdown is not None else [])
        with finalization_held(self.model):  # the EMA reaches the weights once, when the whole fit ends
            history = self.model.fit(**array_pipeline(share, training=True), epochs=epoch + 1, initial_epoch=epoch,
                                     verbose=0, callbacks=callbacks)
        logs = {name: float(values[-1]) for name, values in history.history.items() if values}
        rows = rows or self.rows or counter.batches * (self.share.get("batch_size") or 32)
        seconds = time.perf_counter() - started
        now = time.time()
        waited = [("wait", epoch, *self.waited)] if self.waited else []  # for the order (log.timeline)
        return Report(logs, counter.batches, int(rows), seconds, self.state.read_integers(),
                      phases=[*waited, ("train", epoch, now - seconds, now)],
                      step_seconds=median_step(counter.durations), batch_seconds=sum(counter.durations),
                      seeds=self.state.read_seeds())

    def increment_share(self, epoch: int) -> tuple[dict[str, Any] | None, int | None]:
        """``data.increment``: this epoch's share, the worker's fixed rows plus the epoch's seeded draw from the
        other rows (:func:`~mpi_trainer.data.increment.draw_extra`), and its rows; (None, None) without it."""
        from mpi_trainer.data.increment import draw_extra

        if self.increment is None:
            return None, None
        data, fixed, settings = self.increment
        extra = draw_extra(shares.row_count(data), fixed, epoch, self.transport.rank, shares.SHARE_SEED, settings)
        index = np.concatenate([fixed, extra])
        x, y, weights = (None if part is None else shares.take_rows(part, index) for part in data)
        return {**self.share, "x": x, "y": y, "sample_weight": weights}, len(index)

    def train_part(self, epoch: int, part: int, every: int) -> Report:
        """Round ``part`` of the epoch under ``train.sync_every = k``: the next k batches of this worker's rows,
        in the epoch's order (shuffled once an epoch when fit shuffles); an empty report past its last row."""
        if self.order_epoch != epoch:
            rows = int(self.rows or 0)
            shuffled = self.share.get("shuffle", True)
            self.order = (np.random.default_rng((shares.SHARE_SEED, epoch, self.transport.rank)).permutation(rows)
                          if shuffled else np.arange(rows))
            self.order_epoch = epoch
        size = every * (self.share.get("batch_size") or 32)
        index = self.order[part * size:(part + 1) * size]
        if not len(index):
            return Report({}, 0, 0, 0.0, self.state.read_integers())
        data = shares.take_rows((self.share["x"], self.share["y"], self.share.get("sample_weight")), index)
        share = {**self.share, "x": data[0], "y": data[1], "sample_weight": data[2], "shuffle": False}
        return self.train(epoch, share, len(index))
