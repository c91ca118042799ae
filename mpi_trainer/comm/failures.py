"""When a rank fails: failure notices, MPI errors that name a lost peer, ULFM's shrink, the abort hook.

A rank that fails in a way it can report (an exception, not a stop) sends
every other rank a *failure notice* (a transport's ``notify_failure``); a rank notices it at
its next wait and raises :class:`~mpi_trainer.errors.PeerFailure`, so nobody waits for orders from
a rank that has left. Under ``fault.survive`` a lost peer surfaces as
:class:`~mpi_trainer.errors.RankLost`, and the survivors ``shrink`` to a communicator of
their own and ``agree`` on it (the transports' verbs; this module holds what they share:
the notice's tag and text, the MPI error classes of a lost peer, the check of the mpirun line).
An uncaught exception within a job ends the whole job (:func:`abort_on_error`).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING

from mpi_trainer.errors import AgreedInputError, PeerFailure

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport

# PeerFailure is raised by the transports' waits; importable from here as it always was.
__all__ = ["FAILURE_CLASSES", "NOTICE_CHARS", "NOTICE_SECONDS", "TAG_FAILED", "PeerFailure",
           "abort_on_error", "fault_tolerance_problem", "install_abort_on_error", "notice_text",
           "prepare_mpi_environment"]

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


def prepare_mpi_environment(environ: MutableMapping[str, str] | None = None) -> None:
    """What the MPI library must find in the environment when it starts: call before MPI is initialised.

    Under Open MPI's fault-tolerant MPI (``--with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``)
    the ranks that survive a lost peer skip the runtime's fence at the start of ``MPI_Finalize``:
    across hosts that fence waits for the dead ranks and never returns (a known Open MPI defect,
    open-mpi/ompi#11404). The job's own closing barrier runs on the shrunk communicator before it,
    so nothing is left in flight. Open MPI's UCX one-sided component is left out (see below). A value the
    user set is kept.
    """
    environ = os.environ if environ is None else environ
    if environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes"):
        environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")
    # One node's shared window (mpi_trainer.comm.shared_memory) is the osc "sm" component's; the UCX one,
    # asked first, prints an error on every rank where UCX has no transport for it.
    environ.setdefault("OMPI_MCA_osc", "^ucx")


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


def install_abort_on_error(transport: RankTransport) -> None:
    """Make an uncaught exception on this rank end the whole job promptly.

    The traceback goes to stderr under a header naming the rank and host, then
    ``MPI_Abort`` takes every other rank down, so nothing is left waiting.
    The hook it replaces stays reachable as ``sys.excepthook.previous``.
    """
    previous = getattr(sys.excepthook, "previous", sys.excepthook)  # installed again: keep the user's

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stderr.write(f"mpi_trainer: {transport.describe()} failed:\n{text}")
        sys.stderr.flush()
        sys.stdout.flush()
        transport.abort(1)

    hook.previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook


@contextmanager
def abort_on_error(transport: RankTransport) -> Iterator[None]:
    """Around a job on one rank: within it, an uncaught exception ends the whole job
    (:func:`install_abort_on_error`).

    Leaving it normally, or with input that every rank refused together
    (:class:`~mpi_trainer.errors.AgreedInputError`, which ends each rank by itself), puts back the
    script's own hook (the one before any abort hook, such as the one ``init()`` leaves until ``fit``
    ends): the script's own code after the job is its own. Any other exception keeps the abort hook
    as it leaves: should the script not catch it, the interpreter calls the hook only after this
    block is gone, and the other ranks must still be ended.
    """
    entered = getattr(sys.excepthook, "previous", sys.excepthook)
    install_abort_on_error(transport)
    try:
        yield
    except AgreedInputError:
        sys.excepthook = entered
        raise
    sys.excepthook = entered
