"""Preemption: a signal asks the job to checkpoint at the end of the current round and exit 75.

Separation of concerns: this module only notices the signal and keeps time.
Any rank may receive it (Slurm signals every task; ``mpirun`` passes SIGUSR1 on
to every rank; ``mpi-trainer launch`` sends the job SIGUSR1 when it is itself
signalled). A worker tells the scheduler with its next report
(``Report.preempt``); the scheduler's recorder ends the run after the round it
is closing, with a checkpoint, and every rank leaves with
:class:`~mpi_trainer.errors.Preempted` (exit status 75). Should the round not end
within ``checkpoint.grace_seconds`` of the signal, the rank that got it ends the
job with the same status: the work since the last checkpoint is lost, which
``checkpoint.every_seconds`` bounds.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from mpi_trainer.logs import get_logger


class Preemption:
    """The process's preemption state: which signal came, and the grace timer it started."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self.grace_seconds = 0.0
        self.on_expire: Callable[[], None] | None = None
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def install(self, names: Sequence[str], grace_seconds: float, on_expire: Callable[[], None]) -> None:
        """Handle ``names`` (e.g. ``["SIGTERM", "SIGUSR1"]``) from now on; the main thread only (Python's rule)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self.grace_seconds, self.on_expire = grace_seconds, on_expire
        for name in names:
            number = signal.Signals[name]
            if number not in self._previous:
                self._previous[number] = signal.getsignal(number)
            signal.signal(number, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            return
        self.request(signal.Signals(signum).name)

    def request(self, name: str) -> None:
        """Ask for the stop (what the signal handler does); starts the grace timer."""
        self.signal_name, self.received_at = name, time.monotonic()
        get_logger().warning("%s received: the run checkpoints at the end of the current round and exits "
                             "(within checkpoint.grace_seconds=%g s)", name, self.grace_seconds)
        if self.grace_seconds > 0 and self.on_expire is not None:
            self._timer = threading.Timer(self.grace_seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        get_logger().error("%s: the round did not end within checkpoint.grace_seconds=%g s; ending the job "
                           "(the run resumes from its last checkpoint)", self.signal_name, self.grace_seconds)
        if self.on_expire is not None:
            self.on_expire()

    def uninstall(self) -> None:
        """The job is over: the previous handlers come back and the timer stops."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if threading.current_thread() is threading.main_thread():
            for number, handler in self._previous.items():
                signal.signal(number, handler)
        self._previous = {}
        self.signal_name = self.received_at = None
        self.on_expire = None

