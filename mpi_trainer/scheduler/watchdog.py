"""The scheduler's watchdog: how long to wait for workers, and the failure that names the missing ones."""

from __future__ import annotations

import time
from collections.abc import Callable

from mpi_trainer.algorithms.wait_bounds import WaitBounds
from mpi_trainer.errors import WorkerFailure


class Watchdog:
    """Seconds a round's waits may last (explicit ``watchdog.worker_timeout``, else derived from the
    rounds: :mod:`mpi_trainer.algorithms.wait_bounds`), and who is where."""

    def __init__(self, bounds: WaitBounds, hosts: list[str]) -> None:
        self.bounds = bounds
        self.hosts = hosts

    @property
    def timeout(self) -> float:
        return self.bounds.round

    def observe(self, seconds: float) -> None:
        """A whole round took ``seconds``: the derived bound follows the slowest."""
        self.bounds.observe(seconds)

    def remaining(self, started: float) -> float:
        """Seconds left of the allowance for a round that started at ``started``."""
        return max(1e-3, started + self.timeout - time.perf_counter())

    def deadline(self, started: float) -> Callable[[], float]:
        """Seconds left, asked again at each wait, of the allowance for a round that started at ``started``."""
        return lambda: self.remaining(started)

    def failure(self, what: str, ranks: list[int]) -> WorkerFailure:
        named = ", ".join(f"worker rank {rank} on host {self.hosts[rank]}" for rank in ranks)
        return WorkerFailure(f"watchdog: {named} did not {what} within {self.bounds.describe()}; ending the job")

    def timed_out(self, what: str, error: TimeoutError, ranks: list[int]) -> WorkerFailure:
        """The failure for a wait that timed out, naming the ranks it says were missing (else ``ranks``)."""
        missing: list[int] | None = getattr(error, "missing", None)
        return self.failure(what, missing or ranks)
