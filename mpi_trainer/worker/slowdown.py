"""Playing a straggler on purpose, for tests and benchmarks (``[debug]`` config section).

With ``debug.batch_delay = d`` every worker sleeps ``d`` seconds after each
training batch (simulated work, so that a benchmark on a small, busy machine
measures scheduling rather than CPU contention). A rank named in
``debug.slow_ranks`` trains with a :class:`BatchSlowdown` that makes each batch
(its compute plus ``d``) take ``slow_factor`` times as long, whatever the
model, data or machine. The rank's very first batch is not slowed: it includes
one-time graph tracing, which would add a long pause that says nothing about
the rank's speed round after round. Ranks not named, and every rank when the section is absent,
get no callback at all: the normal training path is untouched.
"""

from __future__ import annotations

import time
from typing import Any

from mpi_trainer.config import DebugConfig
from mpi_trainer.errors import ConfigError


def check_slow_ranks(debug: DebugConfig, world_size: int) -> None:
    """Every rank to slow down must be a worker rank of this job."""
    bad = [rank for rank in debug.slow_ranks if not 1 <= rank < world_size]
    if bad:
        raise ConfigError(f"`debug.slow_ranks` must name worker ranks 1..{world_size - 1} of this "
                          f"{world_size}-rank job. Received: debug.slow_ranks={debug.slow_ranks}")


def make_slowdown(debug: DebugConfig, rank: int) -> Any | None:
    """The slowdown callback for ``rank``, or None when this rank runs at normal speed."""
    factor = debug.slow_factor if rank in debug.slow_ranks else 1.0
    if factor <= 1 and debug.batch_delay <= 0:
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

    return BatchSlowdown(factor, debug.batch_delay)
