"""``train.overlap_eval``: the next epoch's first round is handed out before an epoch is scored, so the workers
train while rank 0 scores and runs the callbacks. Each fit runs on a scheduler and two workers as threads of a
LocalWorld (:func:`tests.unit.trainer.test_policies.fit_set`)."""

from __future__ import annotations

import json
import logging
import threading

import keras
import numpy as np
import pytest

from mpi_trainer.errors import Preempted
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer.worker import WorkerRounds
from tests.unit.trainer.test_policies import LOSE_RANK_2, Keep, Worsening, fit_set, same_everywhere, start_in_place

__all__ = ["start_in_place"]  # the fixture that places every rank in this process

OVERLAP = "train.overlap_eval=true"


def test_overlapped_scoring_trains_and_scores_the_same_states_as_scoring_in_turn():
    """Round r + 1 starts from round r's combined state either way: the same History and weights, bit for bit."""
    in_turn, overlapped = fit_set([], epochs=4), fit_set([OVERLAP], epochs=4)
    same_everywhere(overlapped)
    assert overlapped[0]["history"] == in_turn[0]["history"]
    for mine, theirs in zip(overlapped[0]["weights"], in_turn[0]["weights"], strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert overlapped[0]["summary"]["stop_reason"] == "epochs"


class WaitForTraining(keras.callbacks.Callback):
    """Rank 0's callbacks of epoch 0 wait (at most ``limit`` seconds) until a worker has begun training epoch 1."""

    def __init__(self, began: threading.Event, limit: float) -> None:
        super().__init__()
        self.began, self.limit, self.seen = began, limit, None

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.seen = self.began.wait(self.limit)


def watch_training(monkeypatch) -> threading.Event:
    """An event set when a worker begins training epoch 1."""
    began = threading.Event()
    train = WorkerRounds.train

    def noting(self, epoch, *args, **kwargs):
        if epoch == 1:
            began.set()
        return train(self, epoch, *args, **kwargs)

    monkeypatch.setattr(WorkerRounds, "train", noting)
    return began


def test_the_workers_train_the_next_epoch_while_rank_0_scores_and_runs_the_callbacks(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    waiting = WaitForTraining(watch_training(monkeypatch), limit=60)
    result = fit_set([OVERLAP], callbacks=[waiting])
    assert waiting.seen is True
    assert "validation data scored on rank 0 while the workers train the next epoch" in caplog.text
    same_everywhere(result)
    in_turn = WaitForTraining(watch_training(monkeypatch), limit=1)  # scored in turn: epoch 1 waits for it
    fit_set([], callbacks=[in_turn])
    assert in_turn.seen is False


class StopAfter(keras.callbacks.Callback):
    """Sets ``model.stop_training`` at the end of epoch ``last``."""

    def __init__(self, last: int) -> None:
        super().__init__()
        self.last = last

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.last:
            self.model.stop_training = True


def test_a_round_trained_past_a_callbacks_stop_is_dropped_and_every_rank_ends_with_the_scored_state(caplog):
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    kept = Keep()
    result = fit_set([OVERLAP], epochs=5, callbacks=[StopAfter(1), kept])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1] and result[0]["summary"]["stop_reason"] == "callback"
    assert result[0]["rounds"]["workers"] == [2, 2]  # the dropped round is no epoch of the record
    for final, scored in zip(result[0]["weights"], kept.weights[1], strict=True):
        np.testing.assert_array_equal(final, scored)
    assert "the round of epoch 2 that trained while epoch 1 was scored is dropped" in caplog.text


def test_early_stopping_restores_the_best_weights_on_every_rank_with_scoring_overlapped():
    worsening = Worsening()
    result = fit_set(["early_stopping.patience=2", "early_stopping.monitor=val_loss", OVERLAP], epochs=8,
                     callbacks=[worsening])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1, 2] and result[0]["summary"]["stop_reason"] == "callback"
    for final, best in zip(result[0]["weights"], worsening.best, strict=True):
        np.testing.assert_array_equal(final, best)


class SetRate(keras.callbacks.Callback):
    """Sets the optimizer's learning rate to ``rate`` at the end of epoch 0, as ReduceLROnPlateau would."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.model.optimizer.learning_rate.assign(self.rate)


def test_a_learning_rate_a_callback_sets_while_a_round_trains_reaches_every_rank_a_round_later():
    result = fit_set([OVERLAP], epochs=3, callbacks=[SetRate(0.005)])
    same_everywhere(result)
    assert [result[rank]["rate"] for rank in range(3)] == [pytest.approx(0.005)] * 3


def test_a_non_finite_round_handed_out_ahead_is_trained_again_at_half_the_learning_rate():
    result = fit_set(["debug.nan_rank=1", "debug.nan_round=1", "train.nan_policy=rollback", OVERLAP])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1, 2] and result[0]["summary"]["stop_reason"] == "epochs"
    assert [result[rank]["rate"] for rank in range(3)] == [pytest.approx(0.01)] * 3  # 0.02 halved once


def test_a_worker_lost_in_a_round_handed_out_ahead_leaves_the_other_to_finish():
    result = fit_set(["fault.survive=true", *LOSE_RANK_2, OVERLAP])
    assert result[2] is None  # lost while training epoch 1, handed out as epoch 0 was scored
    assert result[0]["epoch"] == [0, 1, 2] and result[0]["rounds"]["workers"] == [2, 1, 1]
    for mine, theirs in zip(result[1]["weights"], result[0]["weights"], strict=True):
        np.testing.assert_array_equal(mine, theirs)


class Failing(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise ValueError("the user's callback failed at epoch 1")


def test_a_callback_that_fails_while_a_round_trains_reaches_the_user_and_leaves_no_rank_waiting():
    with pytest.raises(ValueError, match="the user's callback failed at epoch 1"):
        fit_set([OVERLAP], epochs=4, callbacks=[Failing()])


class SignalWhileScoring(Preemption):
    """A preemption signal that reaches rank 0 while it scores epoch 0 (set by :class:`Signal`), as the workers
    train epoch 1."""

    raised = threading.Event()

    def install(self, names, grace_seconds, on_expire):  # threads cannot take signals: no handlers
        pass

    @property
    def requested(self) -> bool:
        return self.raised.is_set()


class Signal(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            SignalWhileScoring.raised.set()


def test_a_preemption_while_a_round_handed_out_ahead_trains_checkpoints_the_scored_epoch(tmp_path, monkeypatch):
    monkeypatch.setattr("mpi_trainer.trainer.fit.Preemption", SignalWhileScoring)
    SignalWhileScoring.raised.clear()
    with pytest.raises(Preempted):
        fit_set([OVERLAP], tmp_path / "run", epochs=3, callbacks=[Signal()])
    assert len((tmp_path / "run" / "rounds.csv").read_text().splitlines()) == 1 + 1  # epoch 0, checkpointed
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["stop_reason"] == "preempted"


def test_a_worker_lost_in_the_round_a_stop_drops_leaves_the_survivors_with_the_scored_state():
    kept = Keep()
    lose_rank_2_in_epoch_2 = ["debug.crash_rank=2", "debug.crash_round=2", "debug.crash_phase=train"]
    result = fit_set(["fault.survive=true", *lose_rank_2_in_epoch_2, OVERLAP], epochs=5,
                     callbacks=[StopAfter(1), kept])
    assert result[2] is None  # lost while training epoch 2, which the stop after epoch 1 drops
    assert result[0]["epoch"] == [0, 1] and result[0]["summary"]["stop_reason"] == "callback"
    for rank in (0, 1):
        for final, scored in zip(result[rank]["weights"], kept.weights[1], strict=True):
            np.testing.assert_array_equal(final, scored)
