"""The worker's step timer: which steps it times, the rate it reports, and its Keras callback."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.hooks import TestHooks
from mpi_trainer.worker import step_timer
from mpi_trainer.worker.slowdown import make_slowdown
from mpi_trainer.worker.step_timer import WARM_UP_STEPS, StepTimer


def run_steps(monkeypatch, timer: StepTimer, rows: int, seconds: list[float]) -> tuple[float | None, int]:
    """One round whose step i ends ``seconds[i]`` after the previous one; returns the timer's result."""
    clock = iter(np.cumsum([0.0, *seconds]))
    monkeypatch.setattr(step_timer.time, "perf_counter", lambda: float(next(clock)))
    timer.start_round(rows)
    next(clock)  # the round starts at 0
    for _ in seconds:
        timer.batch_end()
    return timer.finish_round()


def test_the_first_round_leaves_out_its_warm_up_steps_and_the_partial_batch(monkeypatch):
    timer = StepTimer(batch_size=10)
    # 105 rows: 10 full steps and a partial one. Tracing makes the first steps slow, the partial
    # batch's new shape is traced again; the steady full steps take 0.1 s each.
    seconds = [5.0, 0.9, 0.4] + [0.1] * 7 + [3.0]
    assert WARM_UP_STEPS == 3
    rate, timed = run_steps(monkeypatch, timer, 105, seconds)
    assert timed == 7 and rate == pytest.approx(10 / 0.1)
    # Later rounds leave out only their first step (the input pipeline starting).
    rate, timed = run_steps(monkeypatch, timer, 105, [0.7] + [0.2] * 9 + [0.1])
    assert timed == 9 and rate == pytest.approx(10 / 0.2)


def test_a_round_without_a_steady_full_step_reports_no_rate(monkeypatch):
    timer = StepTimer(batch_size=10)
    assert run_steps(monkeypatch, timer, 35, [1.0, 1.0, 1.0, 0.5]) == (None, 0)  # warm-up and a partial batch
    assert run_steps(monkeypatch, timer, 20, [0.1, 0.1]) == (10 / 0.1, 1)


def test_the_callback_times_every_fit_batch_with_the_slowdowns_pause_in_it():
    import keras

    x = np.random.default_rng(0).normal(size=(160, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    slowdown = make_slowdown(TestHooks(slow_ranks=[1], batch_delay=0.02), 1)  # 20 ms after every batch
    timer = StepTimer(batch_size=16)
    timer.start_round(len(x))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[slowdown, timer.callback()])
    rate, timed = timer.finish_round()
    assert timed == 10 - WARM_UP_STEPS
    assert rate < 16 / 0.02  # each timed step holds the slowdown's 20 ms pause
