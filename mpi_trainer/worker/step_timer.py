"""A worker's training speed from the time its steps take, for block rebalancing.

A round's train seconds mix the worker's speed with costs that do not grow
with its block: starting the input pipeline, ending ``fit``, and in the
worker's first round the tracing (compilation) of its train function, which
can take longer than a dozen steps. Block samples over round seconds then
makes small blocks look slow and makes round 0 useless, so the rebalancer had
to wait for two rounds. Steady steps say how fast the worker really trains
from its very first round.

Each step is timed from the end of the previous batch to the end of its own:
its compute, its input and every callback's pause (the test hooks' slowdown
included, which is why the timer runs after it). Left out are the first step
of every round (no previous batch to time from; the input pipeline starts
there), the first ``WARM_UP_STEPS`` of the worker's first round (tracing), and
a partial last batch (a new input shape may be traced again).
"""

from __future__ import annotations

import time
from typing import Any

WARM_UP_STEPS = 3


class StepTimer:
    """Samples per second over one round's steady, full training steps."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size
        self.first_round = True
        self.start_round(0)

    def start_round(self, rows: int) -> None:
        """A new round over ``rows`` samples: forget the last one's steps."""
        self.full_steps = rows // self.batch_size
        self.step = 0
        self.last_end: float | None = None
        self.seconds = 0.0
        self.timed_steps = 0

    def batch_end(self) -> None:
        now = time.perf_counter()
        if self.last_end is not None and self.counts(self.step):
            self.seconds += now - self.last_end
            self.timed_steps += 1
        self.last_end = now
        self.step += 1

    def counts(self, step: int) -> bool:
        """Whether ``step`` (from 0 within the round) is a steady, full step."""
        skipped = WARM_UP_STEPS if self.first_round else 1
        return skipped <= step < self.full_steps

    def finish_round(self) -> tuple[float | None, int]:
        """This round's rate in samples per second (None when no step was timed) and how many steps."""
        self.first_round = False
        if self.timed_steps == 0 or self.seconds <= 0:
            return None, self.timed_steps
        return self.timed_steps * self.batch_size / self.seconds, self.timed_steps

    def callback(self) -> Any:
        """A Keras callback that feeds this timer; put it after callbacks that pause a batch."""
        import keras

        return keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs=None: self.batch_end())
