"""A ``fit`` on the user's own model object, round by round: the scheduler's loop and the worker's.

Separation of concerns: Keras owns training. Each worker calls the model's own ``fit`` for one
epoch on its share of the input (:mod:`.shares`), so its data adapters, ``train_step``, optimizer,
loss scaling and callbacks-free progress are exactly those of plain Keras. The scheduler (rank 0)
owns what happens between rounds: it hands every worker the same state before a round, combines
the workers' states after it (:mod:`.state`: each part by its meaning, the trainable part stepped
by the outer optimizer), has the validation data scored with ``model.evaluate`` (by itself, or by
the workers in shares), runs the user's callbacks with the epoch's logs, and decides when to stop
(the epochs asked for, ``model.stop_training``, or a preemption signal, which checkpoints first).
The run's record (:mod:`.record`) is a sink that rank 0 hands finished epochs to.

A round is an epoch, or ``train.sync_every`` steps of every worker. Every round is three
collectives: the order (a small object) and the state (one flat float32 buffer) from rank 0, then
the workers' states summed into rank 0 and their reports gathered. Scoring by the workers is an
order, the combined state (which then need not travel again) and a sum of the metrics' states.
"""
from __future__ import annotations

import math
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.algorithms.passes import all_finite, default_threads
from mpi_trainer.errors import Preempted, RankLost, WorkerFailure
from mpi_trainer.keras_fit import shares
from mpi_trainer.keras_fit.slowdown import make_slowdown
from mpi_trainer.keras_fit.state import ModelState
from mpi_trainer.keras_fit.sync_choice import SyncChoice, median_step
from mpi_trainer.persistence.preemption import Preemption

if TYPE_CHECKING:
    from mpi_trainer.comm.transport import Transport


@dataclass
class Order:
    """What rank 0 tells the workers before an epoch (``stop``: the job is over; the state that
    follows is the final one; ``score``: score the validation share with the state that follows
    instead of training). ``state_follows`` is False when the workers hold the state already (it
    came back to them with the last round's sum, or was sent for scoring, and nothing changed it
    since), so it does not travel twice: a worker then takes the state it holds."""

    epoch: int
    stop: bool
    integers: list[np.ndarray] = field(default_factory=list)
    score: bool = False
    state_follows: bool = True
    preempted: bool = False  # with ``stop``: the job checkpointed for a preemption signal; every rank exits 75
    part: int = 0  # with ``train.sync_every = k``: which round of the epoch, each k steps of every worker
    parts: int = 1
    every: int = 0  # the steps of such a round (k, or train.sync_warmup_every in the warm-up); 0: the epoch
    budgets: list[int] | None = None  # train.max_steps: each worker's steps in this epoch (None: all its batches)
    # data.rebalance: each worker's part of the dealing order, (start, end), sized by its speed (None: as dealt)
    blocks: list[tuple[int, int]] | None = None

    @property
    def exact(self) -> bool:
        """Whether the state that follows travels exactly (float32) whatever the wire: the state scored, and
        the final one, are rank 0's on every rank."""
        return self.score or self.stop


@dataclass
class Handed:
    """A round handed out: its epoch, each worker's step budget in it (``train.max_steps``), when its time
    started counting in ``rounds.csv`` (``started``) and when it was handed out (``sent``)."""

    epoch: int
    budgets: list[int] | None
    started: float
    sent: float


@dataclass
class Report:
    """A worker's epoch: its Keras logs, the batches and rows it trained, and its integer state."""

    logs: dict[str, float]
    batches: int
    rows: int
    seconds: float
    integers: list[np.ndarray]
    steps: list[int] = field(default_factory=list)  # SSP: its count of each clock (the model's, each optimizer's)
    staleness: int = 0  # SSP: how far ahead of the slowest worker it started (set by rank 0)
    worker: int = 0  # SSP: the rank it came from (set by rank 0)
    phases: list[Any] = field(default_factory=list)  # log.timeline: the worker's (phase, epoch, start, end)
    sent: int = 0  # the bytes the worker sent for this epoch: its state into the sum, and this report
    preempt: bool = False  # a preemption signal reached this worker
    scores: dict[str, float] = field(default_factory=dict)  # best-of: its state's Keras scores on the validation data
    step_seconds: float = 0.0  # its median batch, the first left out (train.sync_every = "auto")
    batch_seconds: float = 0.0  # the seconds inside its batches, summed (the rest of ``seconds`` is fit's own)


def without_autotuning(dataset: Any) -> Any:
    """``dataset`` with tf.data's autotuning off. A ``fit`` or ``evaluate`` call per round builds an iterator
    over it each time, and on destruction an autotuned iterator waits for its background threads, which
    can take as long as the epoch trained (2.4 s after a 2.5 s LeNet epoch on 2 cores, one call in two);
    without autotuning the parallel map and prefetch keep TensorFlow's fixed defaults and end at once."""
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)


def array_pipeline(arguments: dict[str, Any], training: bool) -> dict[str, Any]:
    """``model.fit``'s (``training``) or ``model.evaluate``'s arguments with array inputs turned into the
    pipeline Keras' own adapter builds for them (the same batches, shuffled as ``fit`` shuffles them, class
    weights applied), without tf.data's autotuning (:func:`without_autotuning`), its batches counted so that
    Keras stops at the last one. TensorFlow only; other inputs and backends are returned as they are."""
    import keras

    from mpi_trainer.keras_fit.shares import input_kind

    if (keras.backend.backend() != "tensorflow" or input_kind(arguments.get("x")) != "arrays"
            or arguments.get("steps_per_epoch" if training else "steps") is not None):
        return arguments
    from keras.src.trainers.data_adapters import get_data_adapter

    adapter = get_data_adapter(arguments["x"], arguments.get("y"), arguments.get("sample_weight"),
                               batch_size=arguments.get("batch_size") or 32,
                               shuffle=arguments.get("shuffle", True) if training else False,
                               class_weight=arguments.get("class_weight") if training else None)
    rest = {key: value for key, value in arguments.items()
            if key not in ("x", "y", "sample_weight", "batch_size", "shuffle", "class_weight", "steps")}
    counted = {"steps_per_epoch": adapter.num_batches, "shuffle": False} if training else {"steps": adapter.num_batches}
    return {**rest, "x": without_autotuning(adapter.get_tf_dataset()), **counted}  # shuffled already, as fit would


def reusable_input(evaluate_args: dict[str, Any]) -> dict[str, Any]:
    """``model.evaluate``'s arguments with array inputs turned, once, into Keras' own pipeline for them
    (:func:`array_pipeline`), as Keras' ``fit`` keeps its validation iterator for all its epochs: the same
    batches, without the pipeline built again every epoch (its fixed cost, 0.05-0.1 s a call, is most of a
    small model's scoring)."""
    return array_pipeline(evaluate_args, training=False)


def recorded_logs(callbacks: Any, logs: dict[str, float]) -> dict[str, float]:
    """An epoch's logs as the callbacks' History holds them (callbacks add entries such as ``learning_rate``
    or the test split's ``test_*``)."""
    import keras

    history = next((c for c in callbacks.callbacks if isinstance(c, keras.callbacks.History)), None)
    if history is None or not history.epoch:
        return logs
    return {**logs, **{key: float(values[-1]) for key, values in history.history.items()
                       if len(values) == len(history.epoch)}}


def restored_epoch(callbacks: Any) -> int | None:
    """The epoch whose weights Keras' EarlyStopping restored at the end of training (``restore_best_weights``;
    the last such callback's, as it restored last), or None."""
    import keras

    restored = [callback.best_epoch for callback in callbacks.callbacks
                if isinstance(callback, keras.callbacks.EarlyStopping) and callback.restore_best_weights
                and callback.best_weights is not None]
    return restored[-1] if restored else None


def merged_reports(rounds: list[list[Report]]) -> list[Report]:
    """Each worker's report of an epoch of several rounds: its Keras logs averaged by the rows of each round,
    its batches, rows, seconds and bytes added up, its last integer state and scores, a preemption in any
    round."""
    if len(rounds) == 1:
        return rounds[0]
    merged = []
    for worker in zip(*rounds):
        rows = sum(report.rows for report in worker if report.batches) or 1
        names = sorted({name for report in worker for name in report.logs})
        logs = {name: sum(r.logs.get(name, 0.0) * r.rows for r in worker if r.batches) / rows for name in names}
        merged.append(Report(logs, sum(r.batches for r in worker), sum(r.rows for r in worker),
                             sum(r.seconds for r in worker), worker[-1].integers, sent=sum(r.sent for r in worker),
                             preempt=any(r.preempt for r in worker), scores=worker[-1].scores,
                             phases=[phase for r in worker for phase in r.phases],
                             step_seconds=max(r.step_seconds for r in worker),
                             batch_seconds=sum(r.batch_seconds for r in worker)))
    return merged


def election_score(scores: dict[str, float]) -> tuple[float, float]:
    """What a best-of election ranks a candidate by (:func:`~mpi_trainer.algorithms.aggregation.elect`): its
    validation accuracy (NaN when the model computes none), then its loss."""
    return scores.get("accuracy", math.nan), scores.get("loss", math.nan)


def elected(scores: list[tuple[float, float] | None]) -> int:
    """The index of the winning candidate among the workers' ``(accuracy, loss)`` (None: a worker that trained
    nothing this round, never elected while another did), the same on every rank."""
    from mpi_trainer.algorithms.aggregation import elect

    return elect({index: (math.nan, math.inf) if score is None else score for index, score in enumerate(scores)})


def non_finite_cause(reports: list[Report], combined: np.ndarray | bool) -> str | None:
    """Why a round cannot be kept: a worker's loss, or the combined state (or whether it was found finite),
    not finite (None: it can)."""
    from mpi_trainer.algorithms import nan_guard

    outcomes = [nan_guard.WorkerOutcome(rank + 1, report.logs.get("loss", 0.0), True)
                for rank, report in enumerate(reports) if report.batches]
    return nan_guard.non_finite_cause(outcomes, combined)


def agree_on_metric_size(transport: Transport, size: int) -> None:
    """Every rank's metric state has ``size`` values before they are summed, else the job ends naming them."""
    sizes = transport.allgather(size)
    if len(set(sizes)) != 1:
        raise RuntimeError(f"The ranks' compiled metrics hold different states. Received: {sizes} values by rank; "
                           f"expected the same on every rank (compile the model the same way on every rank)")


class NonFinite(Exception):
    """A round's combined state (or a worker's loss) is not finite; ``reports``: the round's."""

    def __init__(self, cause: str, reports: list[Report]) -> None:
        super().__init__(cause)
        self.cause, self.reports = cause, reports


class RoundClock:
    """Bounds this rank's waits by the rounds seen so far (:mod:`~mpi_trainer.algorithms.wait_bounds`): a
    rank that stops answering is named within a multiple of the slowest round, not the set-up bound."""

    def __init__(self, transport: Transport, bounds: Any) -> None:
        self.transport, self.bounds = transport, bounds
        self.last: float | None = None

    def tick(self) -> None:
        """A round begins: the one before it was a whole round."""
        from mpi_trainer.algorithms.wait_bounds import for_rank

        now = time.perf_counter()
        if self.last is not None:
            self.bounds.observe(now - self.last)
            self.transport.bound = for_rank(self.transport.rank, self.bounds.round)
        self.last = now


class StateWire:
    """How the state crosses the wire (``aggregation.wire_dtype``): the model's variables in the wire dtype, its
    optimizers' variables, the weights and the step counts in float32 (an Adam's second moments are squared
    gradients, below float16's range). Sums are float32 at rank 0 whatever the wire
    (:class:`~mpi_trainer.comm.wire_dtype.WireFormat`); a state broadcast for scoring goes in float32, so that
    every scorer holds rank 0's state exactly."""

    def __init__(self, name: str, model_size: int) -> None:
        from mpi_trainer.comm.wire_dtype import WireFormat

        self.format, self.split = WireFormat(name), model_size

    def broadcast(self, transport: Transport, values: np.ndarray, exact: bool = False) -> None:
        """Rank 0's ``values`` into every worker's."""
        if exact or self.format.summed_by_mpi:
            transport.broadcast(values)
            return
        self.format.broadcast_from_root(transport, values[:self.split])
        if values.size > self.split:
            transport.broadcast(values[self.split:])

    def sum(self, transport: Transport, values: np.ndarray, on_part: Callable[[int, int], None] | None = None,
            on_returned: Callable[[int, int], None] | None = None) -> bool:
        """The workers' ``values`` summed into rank 0's (whose own add nothing: a float32 wire leaves them out, a
        16-bit wire's sum adds the zeros rank 0 holds there); ``on_part(start, stop)`` at rank 0 as each part of
        the sum is complete (a 16-bit wire's model part once it is all summed). True when rank 0's result, as
        ``on_part`` left it, came back into every rank's ``values`` in the same pass (a float32 wire,
        :meth:`~mpi_trainer.comm.transport.Transport.reduce_broadcast`; ``on_returned`` at the workers as each
        part of it arrives); a 16-bit wire's does not."""
        if self.format.summed_by_mpi:  # rank 0 adds nothing of its own: it takes the workers' sum, its values unread
            transport.reduce_broadcast(values, on_part=on_part, root_adds=False, on_returned=on_returned)
            return True
        split = self.split
        self.format.sum_to_root(transport, values[:split])
        if on_part is not None and transport.rank == 0:
            on_part(0, split)
        transport.reduce_sum(values[split:], on_part=None if on_part is None else
                             lambda start, stop: on_part(start + split, stop + split))
        return False


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


class WorkerRounds:
    """A worker: takes the state, trains one epoch of its share with ``model.fit``, reports; scores its share
    of the validation data with ``model.evaluate`` when told to."""

    def __init__(self, transport: Transport, model: Any, state: ModelState, share: dict[str, Any], rows: int | None,
                 weighted: bool, bounds: Any = None, validation: dict[str, Any] | None = None) -> None:
        from mpi_trainer.algorithms.wait_bounds import WaitBounds

        self.transport, self.model, self.state = transport, model, state
        self.clock = RoundClock(transport, bounds or WaitBounds())
        self.share = share  # model.fit's arguments for this worker's share
        self.validation = validation  # model.evaluate's arguments for its share of the validation data
        self.scoring: dict[str, Any] | None = None  # that share as this worker scores it (reusable_input)
        self.election: dict[str, Any] | None = None  # best-of: model.evaluate's arguments for the validation data
        # data.increment: (every training row, this worker's fixed rows, the settings); each epoch adds a draw
        self.increment: tuple[Any, np.ndarray, Any] | None = None
        # fault.survive: after a rank is lost, gives this worker its share for the survivors (None: the job ends)
        self.reshare: Callable[[WorkerRounds], None] | None = None
        test_hooks = hooks.active()  # debug.*: slow batches, and a crash at an epoch's training or contribution
        self.slowdown = make_slowdown(test_hooks, transport.rank)
        self.crash_at = ((test_hooks.crash_round, test_hooks.crash_phase)
                         if test_hooks.crash_rank and test_hooks.crash_rank == transport.world_rank else None)
        # debug.nan_rank / nan_round: this worker's part of that epoch's sum is poisoned once
        self.nan_at = test_hooks.nan_round if test_hooks.nan_rank and test_hooks.nan_rank == transport.rank else None
        self.preemption = Preemption()  # the job's, when the fit installed its signal handlers
        self.augmenter: Any = None  # data.augmentation: Keras' random image layers, applied to each round's rows
        # data.rebalance: (every training row, the order they are dealt in), and the part of it this worker holds
        self.dealt: tuple[Any, np.ndarray] | None = None
        self.block: tuple[int, int] | None = None
        self.order, self.order_epoch = np.arange(0), -1  # the epoch's order of the share's rows
        self.served: int | None = None  # the epoch of the last order taken
        self.waited: tuple[float, float] | None = None  # when this worker began and ended waiting for it
        self.rows = rows  # the rows of the share (arrays); None: counted from the batches
        self.weighted = weighted
        # the state, then this worker's weight, then its count of each clock (the model's steps, each
        # optimizer's): summed over the workers in one reduction
        self.buffer = np.zeros(state.size + 1 + state.clocks, dtype=np.float32)
        self.wire = StateWire("float32", state.model_size)  # aggregation.wire_dtype, set by the fit

    def run(self) -> None:
        """Carry out the scheduler's orders until it says stop."""
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
        self.reshare(self)

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
        if order.stop and order.preempted:
            raise Preempted()
        if order.stop:
            return False
        if order.score:
            self.score()
            return True
        self.train_round(order)
        return True

    def awaiting_order(self) -> str:
        """What this worker waits for, named when the wait runs out."""
        after = "before the first round" if self.served is None else f"after round {self.served}"
        return f"waiting for the scheduler's next order ({after})"

    def train_round(self, order: Order) -> None:
        """Train the round the order names, then add this worker's state to the sum and report."""
        size = self.state.size
        hooks.maybe_freeze(self.transport.rank, order.epoch)  # debug.freeze_rank: this worker stops here
        self.maybe_crash(order.epoch, "train")
        began = self.state.optimizer_steps()
        report = self.train_order(order)
        steps = [report.batches] + [now - then for now, then in zip(self.state.optimizer_steps(), began)]
        weight = float(report.rows if self.weighted else 1) if report.batches else 0.0
        if self.election is not None:
            weight = self.stand(report)
        if weight or self.election is None:
            self.state.contribute(self.buffer[:size], weight, steps)
        else:  # best-of, not elected: this worker adds nothing to the sum
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
        """Test hook (``debug.crash_rank``, ``crash_round``, ``crash_phase``): end this process as kill -9 would."""
        if self.crash_at == (epoch, phase):
            self.transport.crash()

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
        history = self.model.fit(**array_pipeline(share, training=True), epochs=epoch + 1, initial_epoch=epoch,
                                 verbose=0, callbacks=callbacks)
        logs = {name: float(values[-1]) for name, values in history.history.items() if values}
        rows = rows or self.rows or counter.batches * (self.share.get("batch_size") or 32)
        seconds = time.perf_counter() - started
        now = time.time()
        waited = [("wait", epoch, *self.waited)] if self.waited else []  # for the order (log.timeline)
        return Report(logs, counter.batches, int(rows), seconds, self.state.read_integers(),
                      phases=[*waited, ("train", epoch, now - seconds, now)],
                      step_seconds=median_step(counter.durations), batch_seconds=sum(counter.durations))

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


class SchedulerRounds:
    """Rank 0: hands out the state, combines the workers' states, validates, runs the callbacks."""

    def __init__(self, transport: Transport, model: Any, state: ModelState, outer: Any, callbacks: Any,
                 validation: dict[str, Any] | None, validation_freq: Any, record: Any, bounds: Any = None) -> None:
        from mpi_trainer.algorithms.wait_bounds import WaitBounds

        self.transport, self.model, self.state, self.outer = transport, model, state, outer
        self.clock = RoundClock(transport, bounds or WaitBounds())
        self.callbacks, self.validation, self.validation_freq = callbacks, validation, validation_freq
        self.scoring: dict[str, Any] | None = None  # the validation data as rank 0 scores it (reusable_input)
        self.record = record
        self.buffer = np.zeros(state.size + 1 + state.clocks, dtype=np.float32)  # as the workers' (WorkerRounds)
        self.wire = StateWire("float32", state.model_size)  # aggregation.wire_dtype, set by the fit
        self.before = state.empty()  # the global state the round started from
        self.workers_hold = False  # whether the workers hold the state last broadcast (it is in the buffer)
        # between the rounds of an epoch rank 0's model lags: the combined state goes out from the buffer as it
        # is, and the model takes it (from here: the buffer, then the round's start) only when something needs
        # it: the epoch's end, a round rolled back, a rank lost (None: the model holds the state)
        self.latest: np.ndarray | None = None
        self.outer_saved: dict[str, np.ndarray] = {}  # the outer optimizer's state before the round's step
        self.held_exact = True  # whether that broadcast was exact (float32), not through a 16-bit wire
        self.workers_score = False  # whether the workers score the validation data (set by the fit)
        self.preemption = Preemption()  # the job's, when the fit installed its signal handlers
        self.preempted = False  # the run stopped for a preemption signal, checkpointed
        self.reports: list[Report] = []  # the last epoch's
        self.parts = 1  # rounds in the epoch under way
        # train.sync_every and its warm-up: the steps of the epoch's rounds (0: one round, the epoch)
        self.sync_every: Callable[[int], int] = lambda epoch: 0
        self.sync_choice: SyncChoice | None = None  # train.sync_every = "auto": chosen from the first round
        self.before_integers: list[np.ndarray] = []
        self.optimizers_checked = False  # whether the first trained epoch's optimizer steps were looked at
        self.elects = False  # best-of: the workers score their states and the best one is kept (set by the fit)
        self.fault: Any = None  # fault.survive: the fault settings (None: a lost rank ends the job)
        self.nan_policy = "stop"  # train.nan_policy: a non-finite round stops the fit, or is trained again
        self.rollbacks = 0  # rounds rolled back in a row
        self.stop_reason: str | None = None  # why the fit ends early (non-finite, divergence), set at an epoch
        self.divergence: Any = None  # train.divergence: a DivergenceWatch over the epochs' rows (None: off)
        self.stops_on_divergence = False
        self.max_steps = 0  # train.max_steps: the workers' steps, summed, after which the fit stops (0: no bound)
        self.full_steps: list[int] = []  # with max_steps: each worker's batches in a whole epoch
        self.steps_done = 0  # the workers' steps so far, summed (a resumed run's included)
        # rounds an epoch for so many workers at so many steps a round (set by the fit)
        self.plan_parts: Callable[[int, int], int] = lambda workers, every: 1
        self.winner = 0  # best-of: the index among the workers of the last round's elected one
        self.rebalancer: Any = None  # data.rebalance: the workers' blocks, re-cut by their speed (None: fixed)
        self.writes_prepared = False  # whether the buffers later writes fill are made (ModelState.prepare_writes)
        self.overlap = False  # train.overlap_eval: the next epoch's first round trains while an epoch is scored
        self.ahead: Handed | None = None  # that round, handed out and not yet collected
        self.epochs = 0  # the fit's epochs (set by run)

    def run(self, initial_epoch: int, epochs: int) -> dict[str, float]:
        """Every epoch from ``initial_epoch`` to ``epochs``; the last epoch's logs."""
        logs: dict[str, float] = {}
        self.model.stop_training, self.epochs = False, epochs
        self.callbacks.on_train_begin()
        for epoch in range(initial_epoch, epochs):
            logs = self.epoch(epoch)
            if self.preemption.requested or any(report.preempt for report in self.reports):
                self.preempt(epoch)
                return logs
            if self.stop_reason is not None:
                self.record.stopped(self.stop_reason)
                break
            if self.model.stop_training:
                self.record.stopped("callback")  # a callback set model.stop_training
                break
        self.drop_ahead()
        self.callbacks.on_train_end(logs)  # EarlyStopping may restore the best weights: they are the final ones
        self.record.restored_weights(restored_epoch(self.callbacks))
        # An error above reaches the workers as a failure notice (fail_together), never as a stop.
        self.send_stop()
        self.record.count_bytes(self.transport.take_bytes())
        return logs

    def preempt(self, epoch: int) -> None:
        """A preemption signal reached a rank: checkpoint after this epoch, and every rank leaves with
        :class:`~mpi_trainer.errors.Preempted` (the same fit on the run directory resumes from here).
        Training has not ended, so the callbacks' ``on_train_end`` does not run."""
        self.drop_ahead()
        self.record.stopped("preempted")
        self.record.checkpoint(epoch + 1, self.state, self.callbacks, force=True, outer=self.outer.state_arrays())
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
        self.callbacks.on_epoch_begin(epoch)
        times = {"comm_seconds": 0.0, "aggregate_seconds": 0.0}
        reports = self.train_epoch(epoch, times)
        self.reports = reports
        self.rebalance(epoch, reports)
        trained_until = time.time()
        self.steps_done += sum(report.batches for report in reports)
        if self.max_steps and self.steps_done >= self.max_steps and self.stop_reason is None:
            self.stop_reason = "max_steps"
        self.hand_out_ahead(epoch)
        combined = time.perf_counter()
        logs = self.train_logs(reports)
        logs.update(self.validate(epoch))
        scored = time.perf_counter()
        self.callbacks.on_epoch_end(epoch, logs)
        self.epoch_ended()
        logs = self.recorded_logs(logs)
        sent = self.transport.take_bytes() + sum(report.sent for report in reports)  # rank 0's, then the workers'
        trained = {"samples": sum(report.rows for report in reports), "workers": len(reports),
                   "steps": sum(report.batches for report in reports),
                   "winner": self.winner + 1 if self.elects else ""}  # the rows trained; best-of: the rank kept
        self.record.epoch(epoch, logs, reports, {"bytes": sent, "wall_seconds": time.perf_counter() - started,
                                                 **times, "eval_seconds": scored - combined, **trained})
        self.watch_divergence(epoch)
        scored_at = time.time()
        self.record.checkpoint(epoch + 1, self.state, self.callbacks, outer=self.outer.state_arrays())
        hooks.maybe_freeze(0, epoch)  # debug.freeze_rank = 0: rank 0 stops after recording this epoch
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
            self.record.checkpoint(epoch, self.state, self.callbacks, force=True, outer=self.outer.state_arrays())
            raise WorkerFailure(f"{workers} workers left, fewer than fault.min_workers={self.fault.min_workers}; "
                                f"checkpointed before epoch {epoch} and ending the job for `launch` to restart it")
        if self.rebalancer is not None:  # the survivors start from even blocks, measured anew
            from mpi_trainer.algorithms.rebalance import Rebalancer

            self.rebalancer = Rebalancer(shares.even_bounds(self.rebalancer.total, workers), self.rebalancer.smoothing)
        self.record.log.warning("epoch %d: carrying on with %d workers, each on its share for the survivors; the "
                                "epoch's rounds start again from the state reached", epoch, workers)

    def recorded_logs(self, logs: dict[str, float]) -> dict[str, float]:
        return recorded_logs(self.callbacks, logs)

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
        self.send(Order(epoch, False, self.before_integers, part=part, parts=self.parts, every=every,
                        budgets=budgets, blocks=blocks))
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
        kept = reports[self.winner if self.elects else 0].integers  # other than step counts: a worker's own
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
        last = self.stop_reason == "max_steps"  # the fit's last epoch is scored, as the epochs' last is
        if self.validation is None or not (last or self.model._should_eval(epoch, self.validation_freq)):
            return {}
        if self.elects:  # the combined state is the elected worker's: its scores are the epoch's
            scores = self.reports[self.winner].scores
        elif self.workers_score:
            scores = self.score_on_workers(epoch)
        else:
            if self.scoring is None:
                self.scoring = reusable_input(self.validation)
            scores = self.model.evaluate(**self.scoring, verbose=0, return_dict=True)
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
