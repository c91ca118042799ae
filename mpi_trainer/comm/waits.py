"""Bounded waits that sleep: how a rank waits for its peers without spinning a core.

A rank blocked in a plain MPI call spins a CPU core that the workers need for
training, so every *wait for a peer* is a non-blocking request polled with
short, growing sleeps (:func:`poll_sleep`), and it can time out
(:class:`TransportTimeout`, naming the ranks that never arrived). A transfer
that every peer has entered runs as the blocking call instead (Open MPI
advances a transfer only inside MPI calls), timed and watched by a
:class:`StuckGuard` that ends the job if a peer stops inside it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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



class PolledWaits:
    """The waits of the MPI transport (a mixin of :class:`~mpi_trainer.comm.transport.Transport`).

    It expects ``comm``, ``_mpi``, ``max_sleep``, ``phase``, ``_guard`` and the accounting's
    counters and names, and ``check_notices`` (a failure notice ends any wait).
    """

    @contextmanager
    def _timed(self) -> Iterator[None]:
        """Add the wall and CPU time of the block to this rank's time in the transport."""
        wall0, cpu0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wait_wall_seconds += time.perf_counter() - wall0
            self.wait_cpu_seconds += time.process_time() - cpu0

    @contextmanager
    def _bulk(self, timeout: float | None, what: str) -> Iterator[None]:
        """Time a blocking transfer that every peer has entered; past ``timeout``, end the job.

        A blocking MPI call cannot time out, and a peer stopped inside it would
        hold this rank for ever, so the transport's :class:`StuckGuard` names the
        transfer and aborts.
        """
        armed = timeout is not None and self._guard_ready()
        if armed:
            self._guard.arm(timeout, what)
        try:
            with self._timed():
                yield
        finally:
            if armed:
                self._guard.disarm()

    def _guard_ready(self) -> bool:
        """Whether a guard thread can watch this rank's blocking calls (MPI must allow threads)."""
        if self._guard is None and self._mpi.Query_thread() >= self._mpi.THREAD_MULTIPLE:
            self._guard = StuckGuard(self._abort_stuck)
        return self._guard is not None

    def _abort_stuck(self, what: str, timeout: float) -> None:
        sys.stderr.write(f"mpi_trainer: error: {self.describe()}: the {what} did not complete within "
                         f"{timeout:g} s of every rank entering it (a peer stopped inside it); ending the job\n")
        sys.stderr.flush()
        self.abort(STUCK_TRANSFER_EXIT)

    # -- waiting ----------------------------------------------------------
    def _blocking(self, timeout: float | None) -> bool:
        return self.max_sleep <= 0 and timeout is None

    def _poll(self, ready: Callable[[], bool], timeout: float | None, what: str,
              missing: Callable[[], list[int]] = list, due: float | None = None) -> None:
        """Call ``ready()`` with growing sleeps until it is true; TransportTimeout after ``timeout``.

        ``due`` (a ``time.perf_counter()`` time): when the awaited message is expected; see
        :func:`due_sleep`.
        """
        with self._timed():
            started = time.perf_counter()
            while not ready():
                now = time.perf_counter()
                waited = now - started
                if timeout is not None and waited > timeout:
                    raise self._timeout(what, timeout, missing())
                pause = poll_sleep(waited, self.max_sleep)
                if due is not None:
                    pause = due_sleep(pause, now, started, due)
                if pause > 0:
                    self.check_notices()  # once per sleep: a rank that failed and left is not waited for
                    time.sleep(pause)

    def _timeout(self, what: str, timeout: float, missing: list[int]) -> TransportTimeout:
        named = f" (waiting for {self.name_ranks(missing)})" if missing else ""
        return TransportTimeout(f"{self.describe()}, {self.phase}: no {what} within {timeout:g} s{named}", missing)


    def _wait(self, request: Any, what: str = "completion", timeout: float | None = None,
              peer: int | None = None) -> None:
        """Wait for ``request``; a timeout names ``peer``, the rank it depends on, when there is one."""
        if self._blocking(timeout):
            with self._timed():
                request.Wait()
            return
        self._poll(request.Test, timeout, what, list if peer is None else lambda: [peer])

    def _wait_for_peer(self, peer: int, tag: int, timeout: float | None, what: str) -> None:
        """Sleep until an empty message arrives from ``peer`` on ``tag``.

        A receive still pending at the timeout is cancelled, so that a late
        message cannot complete it behind the caller's back.
        """
        request = self.comm.Irecv([NOTHING, self._mpi.BYTE], peer, tag)
        if self._blocking(timeout):
            with self._timed():
                request.Wait()
            return
        try:
            self._poll(request.Test, timeout, what, lambda: [peer])
        except TimeoutError:
            request.Cancel()
            request.Wait()
            raise

    def _probe(self, source: int, tag: int, timeout: float | None, due: float | None = None) -> Any:
        status = self._mpi.Status()
        what = f"message (tag {tag}) from {'any rank' if source < 0 else f'rank {source}'}"
        if self._blocking(timeout):
            with self._timed():
                self.comm.Probe(source, tag, status)
        else:
            self._poll(lambda: self.comm.Iprobe(source, tag, status), timeout, what,
                       lambda: [] if source < 0 else [source], due)
        return status
