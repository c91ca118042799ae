"""A ``fit`` on the user's own model object, round by round: the scheduler's loop and the worker's.

Separation of concerns: Keras owns training. Each worker calls the model's own ``fit`` for one
epoch on its share of the input (:mod:`.shares`), so its data adapters, ``train_step``, optimizer,
loss scaling and callbacks-free progress are exactly those of plain Keras. The scheduler (rank 0)
owns what happens between rounds: it hands every worker the same state before a round, combines
the workers' states after it (:mod:`.state`: each part by its meaning, the trainable part stepped
by the outer optimizer), has the validation data scored with ``model.evaluate`` (by itself, or by
the workers in shares), runs the user's callbacks with the epoch's logs, and decides when to stop
(the epochs asked for, ``model.stop_training``, or a preemption signal, which checkpoints first).
The run's record (:mod:`.run_record`) is a sink that rank 0 hands finished epochs to.

A round is an epoch, or ``train.sync_every`` steps of every worker. Every round is three
collectives: the order (a small object) and the state (one flat float32 buffer) from rank 0, then
the workers' states summed into rank 0 and their reports gathered. Scoring by the workers is an
order, the combined state (which then need not travel again) and a sum of the metrics' states.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.hooks import TestHooks

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport


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
    # a resumed run's first order: each worker's seed generators' states as the checkpoint kept them (None: go on)
    seeds: list[list[np.ndarray]] | None = None

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
    seeds: list[np.ndarray] = field(default_factory=list)  # its seed generators' states after it trained


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

    from mpi_trainer.data.adapters import input_kind

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
                             batch_seconds=sum(r.batch_seconds for r in worker), seeds=worker[-1].seeds))
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


def agree_on_metric_size(transport: RankTransport, size: int) -> None:
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

    def __init__(self, transport: RankTransport, bounds: Any, *others: RankTransport | None) -> None:
        """``others``: the rank's other communicators it waits on inside rounds (synchronous SGD's workers'
        own, whose step sums a silent worker would hold up), bounded alike."""
        self.transport, self.bounds = transport, bounds
        self.others = [other for other in others if other is not None]
        self.last: float | None = None

    def tick(self) -> None:
        """A round begins: the one before it was a whole round."""
        from mpi_trainer.algorithms.wait_bounds import for_rank

        now = time.perf_counter()
        if self.last is not None:
            self.bounds.observe(now - self.last)
            self.transport.bound = for_rank(self.transport.rank, self.bounds.round)
            for other in self.others:
                other.bound = self.transport.bound
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

    def broadcast(self, transport: RankTransport, values: np.ndarray, exact: bool = False) -> None:
        """Rank 0's ``values`` into every worker's."""
        if exact or self.format.summed_by_mpi:
            transport.broadcast(values)
            return
        self.format.broadcast_from_root(transport, values[:self.split])
        if values.size > self.split:
            transport.broadcast(values[self.split:])

    def sum(self, transport: RankTransport, values: np.ndarray, on_part: Callable[[int, int], None] | None = None,
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


@dataclass
class RoundPolicies:
    """What the fit's settings ask of the scheduler's rounds, handed to :class:`~.scheduler.SchedulerRounds`
    whole (the defaults: one averaged round an epoch, scored on rank 0, a non-finite round stopping the fit)."""

    workers_score: bool = False  # evaluation.where: the workers score the validation data in shares
    elects: bool = False  # aggregation.method = "best": each worker's state scored, the best kept
    synchronous: bool = False  # aggregation.method = "synchronous": the workers hold one state, one of them kept
    overlap: bool = False  # train.overlap_eval: the next epoch's first round trains while an epoch is scored
    wire: StateWire | None = None  # aggregation.wire_dtype (None: float32)
    sync_choice: Any = None  # train.sync_every = "auto": a SyncChoice, chosen from the first round
    # train.sync_every and its warm-up: the steps of an epoch's rounds (0: one round, the epoch)
    sync_every: Callable[[int], int] = field(default=lambda epoch: 0)
    # the rounds an epoch for so many workers at so many steps a round
    plan_parts: Callable[[int, int], int] = field(default=lambda workers, every: 1)
    preemption: Any = None  # the job's Preemption, when the fit installed its signal handlers (None: none)
    nan_policy: str = "stop"  # train.nan_policy: a non-finite round stops the fit, or is trained again
    rebalancer: Any = None  # data.rebalance: the workers' blocks, re-cut by their speed (None: fixed)
    max_steps: int = 0  # train.max_steps: the workers' steps, summed, after which the fit stops (0: no bound)
    full_steps: list[int] = field(default_factory=list)  # with max_steps: each worker's batches in a whole epoch
    divergence: Any = None  # train.divergence: a DivergenceWatch over the epochs' rows (None: off)
    stops_on_divergence: bool = False
    fault: Any = None  # fault.survive: the fault settings (None: a lost rank ends the job)
    test_hooks: TestHooks = field(default_factory=TestHooks)  # debug.*: rank 0's freeze, for tests

