"""Everything that speaks MPI (this is the only package that imports mpi4py), behind one interface
(:class:`~mpi_trainer.comm.interface.RankTransport`) and one factory (:func:`open_transport`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport

TRANSPORTS = ("mpi",)  # the kinds :func:`open_transport` makes (tests build in-process ones themselves)


def open_transport(kind: str = "mpi") -> RankTransport:
    """This process's transport over every rank of the job: the one place a transport is made. ``"mpi"``:
    ``MPI_COMM_WORLD`` through mpi4py (without ``mpirun``, a job of one rank)."""
    if kind not in TRANSPORTS:
        raise ValueError(f"Unknown transport. Received: kind={kind!r}; expected one of {list(TRANSPORTS)}")
    from mpi_trainer.comm.transport import Transport

    return Transport()
