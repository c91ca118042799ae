"""When a rank fails: failure notices, MPI errors that name a lost peer, ULFM's shrink, the abort hook.

A rank that fails in a way it can report (an exception, not a stop) sends
every other rank a *failure notice* (``notify_failure``); a rank notices it at
its next wait and raises :class:`~mpi_trainer.errors.PeerFailure`, so nobody waits for orders from
a rank that has left. Under ``fault.survive`` a lost peer surfaces as
:class:`~mpi_trainer.errors.RankLost` (:func:`surfacing_failures`), and the
survivors ``shrink`` to a communicator of their own and ``agree`` on it. An
uncaught exception ends the whole job (:func:`install_abort_on_error`).
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from mpi_trainer.comm.accounting import Shrunk
from mpi_trainer.errors import PeerFailure, RankLost

# After the hand-shake tags of mpi_trainer.comm.handshakes.
TAG_FAILED = 21  # a failure notice: the sender failed and left the job (pickled rank, host, text)

# A failure notice carries at most this many characters of the error (it must stay an eager message).
NOTICE_CHARS = 2000
# Seconds a failing rank spends handing its notices to MPI before it gives up on a peer that takes none.
NOTICE_SECONDS = 5.0


def notice_text(exc: BaseException) -> str:
    """What a failure notice says about ``exc``: its type and message, cut to ``NOTICE_CHARS``."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= NOTICE_CHARS else text[:NOTICE_CHARS - 3] + "..."



# MPI error classes that say a peer failed (ULFM): the verbs raise RankLost for them.
FAILURE_CLASSES = ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")


def surfacing_failures(verb: Callable[..., Any]) -> Callable[..., Any]:
    """A verb that raises :class:`RankLost` where MPI reports a failed peer or a revoked communicator."""

    @functools.wraps(verb)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return verb(self, *args, **kwargs)
        except self._mpi.Exception as exc:
            if exc.Get_error_class() not in self._failure_classes:
                raise
            raise RankLost(f"{self.describe()}: {exc.Get_error_string()}") from exc

    return wrapper


def fault_tolerance_problem(environ: dict[str, str] | None = None) -> str | None:
    """What stops this job from surviving a lost rank (``fault.survive``), or None when nothing does.

    The MPI library must have ULFM (Open MPI 5), and ``mpirun`` must have started the job with it on
    (``--with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``) over a transport that reports a lost
    peer: the ob1 messaging layer over TCP (``--mca pml ob1 --mca btl tcp,self``). Over the default
    shared-memory transport a collective with a lost peer hangs instead of failing.
    """
    from mpi4py import MPI

    environ = dict(os.environ if environ is None else environ)
    library = MPI.Get_library_version().splitlines()[0].strip()
    version = re.match(r"Open MPI v(\d+)", library)
    if not hasattr(MPI.Comm, "Shrink") or version is None or int(version.group(1)) < 5:
        return f"the MPI library has no fault-tolerant MPI (ULFM); it needs Open MPI 5 or later. Received: {library}"
    if environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes", "enabled"):
        return "the job was started without fault-tolerant MPI. Received: no `--with-ft ulfm` on the mpirun line"
    btl, pml = environ.get("OMPI_MCA_btl", ""), environ.get("OMPI_MCA_pml", "")
    if pml != "ob1" or not btl or btl.startswith("^") or {"sm", "vader"} & set(btl.split(",")):
        return (f"the job's transport does not report a lost rank (shared memory hangs instead). Received: "
                f"--mca pml {pml or '(default)'} --mca btl {btl or '(default)'}; expected --mca pml ob1 "
                f"--mca btl tcp,self")
    return None


class FailureHandling:
    """Failure notices and ULFM for the MPI transport (a mixin of :class:`~mpi_trainer.comm.transport.Transport`)."""

    def notify_failure(self, text: str) -> None:
        """Tell every other rank that this one failed with ``text`` and is leaving the job.

        The notice is small, so MPI sends it eagerly even to a peer that is busy or stopped;
        a peer that takes nothing within ``NOTICE_SECONDS`` is left behind.
        """
        data = pickle.dumps((self.rank, self.host, text[:NOTICE_CHARS]), protocol=pickle.HIGHEST_PROTOCOL)
        requests = [self.comm.Isend([data, self._mpi.BYTE], rank, TAG_FAILED)
                    for rank in range(self.size) if rank != self.rank]
        deadline = time.perf_counter() + NOTICE_SECONDS
        while not all(request.Test() for request in requests) and time.perf_counter() < deadline:
            time.sleep(1e-3)

    def check_notices(self) -> None:
        """Raise :class:`PeerFailure` when another rank's failure notice has arrived."""
        status = self._mpi.Status()
        if not self.comm.Iprobe(self._mpi.ANY_SOURCE, TAG_FAILED, status):
            return
        data = bytearray(status.Get_count(self._mpi.BYTE))
        self.comm.Recv([data, self._mpi.BYTE], status.Get_source(), TAG_FAILED)
        raise PeerFailure(*pickle.loads(data))

    def shrink(self, timeout: float | None = None) -> Shrunk:
        """Revoke the communicator (every survivor's pending and later calls on it fail, so all of them
        come here), then carry on with a new one of the survivors, renumbered in their old order.
        """
        old = self.comm
        try:
            old.Revoke()
        except self._mpi.Exception:
            pass  # revoked already, by the rank that noticed first
        # Blocking: a polled MPI_Comm_ishrink fails with MPI_ERR_INTERN in Open MPI 5.0. Past ``timeout``
        # (a survivor that never comes) the job ends, as for any stuck transfer.
        with self._bulk(self._limit(timeout), "shrink of the communicator to the surviving ranks"):
            new = old.Shrink()
        new.Set_errhandler(self._mpi.ERRORS_RETURN)  # failures stay exceptions on the new communicator
        survivors = self._mpi.Group.Translate_ranks(new.Get_group(), list(range(new.Get_size())), old.Get_group())
        self.comm = new
        return self._renumber(list(survivors))

    @surfacing_failures
    def agree(self, flag: int) -> int:
        """ULFM's fault-tolerant agreement: the bitwise AND of every live rank's ``flag``; RankLost
        when a rank of the communicator failed (shrink again, then agree again)."""
        return self.comm.Agree(flag)

    def crash(self) -> None:
        """Test hook: end this process at once, as ``kill -9`` would (no MPI_Finalize, no exit code)."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)



def install_abort_on_error(transport: Any) -> None:
    """Make an uncaught exception on this rank end the whole job promptly.

    The traceback goes to stderr under a header naming the rank and host, then
    ``MPI_Abort`` takes every other rank down, so nothing is left waiting.
    The hook it replaces stays reachable as ``sys.excepthook.previous``.
    """
    previous = getattr(sys.excepthook, "previous", sys.excepthook)  # installed again: keep the user's

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"mpi_trainer: {transport.describe()} failed:\n{text}")
        sys.stderr.flush()
        sys.stdout.flush()
        transport.abort(1)

    hook.previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook
