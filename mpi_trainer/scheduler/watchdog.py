"""The scheduler's watchdog: how long to wait for workers, and the failure that names the missing ones."""

from __future__ import annotations

import time

from mpi_trainer.errors import WorkerFailure


class Watchdog:
    """``watchdog.worker_timeout`` seconds per round (0: wait forever), and who is where."""

    def __init__(self, worker_timeout: float, hosts: list[str]) -> None:
        self.timeout = worker_timeout or None
        self.hosts = hosts

    def remaining(self, started: float) -> float | None:
        """Seconds left of the allowance for a round that started at ``started`` (None: no watchdog)."""
        if self.timeout is None:
            return None
        return max(1e-3, started + self.timeout - time.perf_counter())

    def deadline(self, started: float):  # noqa: ANN201 - a zero-argument callable
        return lambda: self.remaining(started)

    def failure(self, what: str, ranks: list[int]) -> WorkerFailure:
        named = ", ".join(f"worker rank {rank} on host {self.hosts[rank]}" for rank in ranks)
        return WorkerFailure(f"watchdog: {named} did not {what} within watchdog.worker_timeout="
                             f"{self.timeout:g} s; ending the job")
