"""Bounded waits that sleep: how a rank waits for its peers without spinning a core.

A rank blocked in a plain MPI call spins a CPU core that the workers need for
training, so every *wait for a peer* is a non-blocking request polled with
short, growing sleeps (:func:`poll_sleep`), and it can time out
(:class:`TransportTimeout`, naming the ranks that never arrived). A transfer
that every peer has entered runs as the blocking call instead (Open MPI
advances a transfer only inside MPI calls), timed and watched by a
:class:`StuckGuard` that ends the job if a peer stops inside it. The waits
themselves are :class:`~mpi_trainer.comm.transport.Transport`'s; this module
holds their pure parts: the sleeps, the timeout error and the guard.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from mpi_trainer.errors import EXIT_WORKER_FAILURE

# A blocking transfer held up past the watchdog's timeout ends the job with the
# watchdog's exit status (mpi_trainer.errors.EXIT_WORKER_FAILURE).
STUCK_TRANSFER_EXIT = EXIT_WORKER_FAILURE

# Polling back-off: for the first 200 us a wait polls without pausing (a sleep
# lasts at least ~60 us on Linux, longer than a readiness message takes, and
# yielding the core to a busy neighbour costs its whole time slice); then each
# sleep is a tenth of the time waited so far, from 20 us up to ``max_sleep``. A
# peer that arrives is noticed at most 10 % late, while a long wait wakes only
# every ``max_sleep`` (about 1 % of a core).
_SPIN_SECONDS = 2e-4
_FIRST_SLEEP = 2e-5
_SLEEP_FRACTION = 0.1
DEFAULT_MAX_SLEEP = 0.005

# Waits for a message whose arrival time is known (a worker's report at k steps per round,
# expected when the last round's came): from shortly before it is due until a little after, the
# wait polls every ``_DUE_SLEEP`` instead of following the back-off, whose sleeps have grown to
# ``max_sleep`` by then and would notice the message up to that late. The window is a
# fraction of the wait, capped in seconds, so a long round spends at most ~12 ms polling finely.
_DUE_LEAD_FRACTION, _DUE_LEAD = 0.05, 2e-3
_DUE_GRACE_FRACTION, _DUE_GRACE = 0.25, 1e-2
_DUE_SLEEP = 5e-5

NOTHING = np.empty(0, np.uint8)  # the payload of the readiness messages


def poll_sleep(waited: float, max_sleep: float) -> float:
    """The next sleep of a wait that has lasted ``waited`` seconds (0: poll again at once)."""
    if waited < _SPIN_SECONDS:
        return 0.0
    return min(max(_FIRST_SLEEP, waited * _SLEEP_FRACTION), max(max_sleep, _FIRST_SLEEP))


def due_sleep(pause: float, now: float, started: float, due: float) -> float:
    """``pause`` (the back-off's next sleep) shortened around ``due``, when a message is expected.

    Before the fine window opens, no sleep runs past its opening; inside it, sleeps are
    ``_DUE_SLEEP``; after it closes (the message is late), the back-off goes on unchanged.
    """
    span = max(due - started, 0.0)
    opens = due - min(_DUE_LEAD_FRACTION * span, _DUE_LEAD)
    closes = due + min(_DUE_GRACE_FRACTION * span, _DUE_GRACE)
    if now < opens:
        return min(pause, opens - now)
    return min(pause, _DUE_SLEEP) if now < closes else pause



class TransportTimeout(TimeoutError):
    """A wait for peers ran out of time; ``missing`` names the ranks that never arrived."""

    def __init__(self, message: str, missing: list[int]) -> None:
        super().__init__(message)
        self.missing = missing



class StuckGuard:
    """One sleeping thread per transport that ends the job when a blocking transfer outlives its bound.

    Arming and disarming only set an attribute, so a transfer costs no thread start (a timer per
    call did, a millisecond and more on a loaded machine); the thread wakes every ``tick`` seconds.
    """

    def __init__(self, on_stuck: Callable[[str, float], None], tick: float = 0.25) -> None:
        self.on_stuck, self.tick = on_stuck, tick
        self.armed: tuple[float, str, float] | None = None  # (deadline, what, timeout)
        threading.Thread(target=self._watch, name="mpi_trainer-stuck-guard", daemon=True).start()

    def arm(self, timeout: float, what: str) -> None:
        self.armed = (time.perf_counter() + timeout, what, timeout)

    def disarm(self) -> None:
        self.armed = None

    def _watch(self) -> None:
        while True:
            time.sleep(self.tick)
            armed = self.armed
            if armed is not None and time.perf_counter() > armed[0]:
                self.on_stuck(armed[1], armed[2])
                return
