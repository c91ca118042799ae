"""Rank 0's side of Keras' fit loop, one for every way of training.

Synchronous rounds (:class:`~.scheduler.SchedulerRounds`), SSP (:class:`~.ssp.StaleScheduler`) and full-batch
L-BFGS (:class:`~.lbfgs.LbfgsScheduler`) differ in how an epoch trains; what happens around it is Keras'
``fit`` loop and is the same for all three, so it is written once here: the callbacks called as ``fit`` calls
them, the validation data scored on rank 0 when due (with the callbacks, as ``fit`` validates), each epoch's
logs recorded as the History holds them, the checkpoint after it, the reasons a fit ends (a callback's
``stop_training``, a preemption signal) and the end of training (EarlyStopping's restored weights named in the
run record).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mpi_trainer.trainer.round_protocol import recorded_logs, restored_epoch, reusable_input

if TYPE_CHECKING:
    from mpi_trainer.persistence.preemption import Preemption
    from mpi_trainer.trainer.run_record import FitRecord
    from mpi_trainer.trainer.state import ModelState


class EpochDriver:
    """The fit loop around a way of training's epochs: ``begin``, then for each epoch ``begin_epoch``, the
    way's own training (and :meth:`score` where rank 0 scores), ``end_epoch``; then ``end``."""

    def __init__(self, model: Any, callbacks: Any, record: FitRecord, state: ModelState, preemption: Preemption,
                 validation: dict[str, Any] | None = None, validation_freq: Any = 1) -> None:
        """``validation``: ``model.evaluate``'s arguments for the validation data (None: none), scored at the
        epochs ``validation_freq`` names, as Keras' ``fit`` scores them."""
        self.model, self.callbacks, self.record, self.state = model, callbacks, record, state
        self.preemption = preemption
        self.validation, self.validation_freq = validation, validation_freq
        self.scoring: dict[str, Any] | None = None  # the validation data as rank 0 scores it, made at first use
        self.preempting = False  # whether the last epoch ended with a preemption signal on some rank

    def begin(self) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()

    def begin_epoch(self, epoch: int) -> None:
        self.callbacks.on_epoch_begin(epoch)

    def due(self, epoch: int, last: bool = False) -> bool:
        """Whether ``epoch`` is scored: the validation data given and ``validation_freq`` naming it, or the fit's
        ``last`` epoch (one that ends it early: Keras scores its epochs' last)."""
        return self.validation is not None and (last or self.model._should_eval(epoch, self.validation_freq))

    def score(self) -> dict[str, float]:
        """The model's scores on the validation data, on rank 0, with the fit's callbacks: their ``on_test_*``
        hooks run as in Keras' ``fit`` (SwapEMAWeights scores the EMA)."""
        if self.scoring is None:
            self.scoring = reusable_input(self.validation or {})
        scores = self.model.evaluate(**self.scoring, verbose=0, return_dict=True, callbacks=self.callbacks)
        return {f"val_{name}": float(value) for name, value in scores.items()}

    def end_epoch(self, epoch: int, logs: dict[str, float], reports: list[Any], times: dict[str, Any],
                  started: float, preempting: bool = False, watch: Callable[[int], None] | None = None,
                  outer: dict[str, Any] | None = None) -> dict[str, float]:
        """The epoch's callbacks, its row in the run record (its logs as the History holds them, ``times``
        with its wall seconds from ``started``, a ``perf_counter`` reading), ``watch`` over that row, then its
        checkpoint (``outer``: the outer optimizer's state saved beside it), forced when a preemption signal
        reached this rank by the callbacks' end or, ``preempting``, another (:attr:`preempting` says which
        was); returns the logs as recorded."""
        self.callbacks.on_epoch_end(epoch, logs)
        logs = recorded_logs(self.callbacks, logs)
        self.record.epoch(epoch, logs, reports, {**times, "wall_seconds": time.perf_counter() - started})
        if watch is not None:
            watch(epoch)
        self.preempting = preempting or self.preemption.requested  # asked once an epoch
        if self.preempting:
            self.record.stopped("preempted")  # so the checkpoint says, as the run's summary will
        self.record.checkpoint(epoch + 1, self.state, self.callbacks, force=self.preempting, outer=outer)
        return logs

    def stop_reason(self, preempting: bool) -> str | None:
        """Why the fit ends after this epoch, if it does: a preemption signal, or a callback's ``stop_training``."""
        if preempting:
            return "preempted"
        return "callback" if self.model.stop_training else None

    def end(self, logs: dict[str, float], reason: str | None) -> None:
        """Training is over (not preempted: a preempted fit goes on in the next job): the callbacks'
        ``on_train_end`` (EarlyStopping may restore the best weights: they are the final ones, and the record
        says whose they are), and why it ended."""
        self.callbacks.on_train_end(logs)
        self.record.restored_weights(restored_epoch(self.callbacks))
        if reason is not None:
            self.record.stopped(reason)
