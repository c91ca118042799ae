"""Playing a straggler on purpose, for tests and benchmarks (:mod:`mpi_trainer.hooks`).

With the ``batch_delay = d`` hook every worker sleeps ``d`` seconds after each
training batch (simulated work, so that a benchmark on a small, busy machine
measures scheduling rather than CPU contention). A rank named in
``slow_ranks`` trains with a :class:`BatchSlowdown` that makes each batch
(its compute plus ``d``) take ``slow_factor`` times as long, whatever the
model, data or machine. The rank's very first batch is not slowed: it includes
one-time graph tracing, which would add a long pause that says nothing about
the rank's speed round after round. Ranks not named, and every rank when no hook is set,
get no callback at all: the normal training path is untouched.
"""

from __future__ import annotations

import time
from typing import Any

from mpi_trainer.hooks import TestHooks


def make_slowdown(test_hooks: TestHooks, rank: int) -> Any | None:
    """The slowdown callback for ``rank``, or None when this rank runs at normal speed."""
    factor = test_hooks.slow_factor if test_hooks.slows(rank) else 1.0
    if factor <= 1 and test_hooks.batch_delay <= 0:
        return None
    import keras

    class BatchSlowdown(keras.callbacks.Callback):
        def __init__(self, factor: float, delay: float) -> None:
            super().__init__()
            self.factor = factor
            self.delay = delay
            self.batch_started = 0.0
            self.slept_seconds = 0.0
            self.slowed_batch_seconds = 0.0
            self.batches_seen = 0

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.batch_started = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.batches_seen += 1
            if self.batches_seen == 1:
                return
            batch_seconds = time.perf_counter() - self.batch_started
            pause = self.delay + (self.factor - 1) * (batch_seconds + self.delay)
            self.slowed_batch_seconds += batch_seconds
            time.sleep(pause)
            self.slept_seconds += pause

    return BatchSlowdown(factor, test_hooks.batch_delay)
