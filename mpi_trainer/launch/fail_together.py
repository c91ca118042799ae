"""How a job ends when something goes wrong on one rank, so that no rank is left waiting.

* Bad input is agreed on by every rank before training (:func:`mpi_trainer.launch.agreement.agree`):
  all of them raise it together.
* A rank that raises (a bug, a Keras callback, an interrupt) tells every other rank before the
  exception leaves :func:`mpi_trainer.fit`: each of them raises
  :class:`~mpi_trainer.errors.PeerFailure` naming it at its next wait. A script that catches
  the exception (a sweep loop) goes on with every rank out of the job, none waiting for orders.
* A rank that stops answering cannot be told anything: the first wait to run out of its bound
  names it (rank, host, phase) and ends the whole job with ``MPI_Abort``, exit status 3.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from mpi_trainer.comm.transport import TransportTimeout, notice_text
from mpi_trainer.errors import EXIT_WORKER_FAILURE, AgreedInputError, PeerFailure, Preempted
from mpi_trainer.logs import get_logger

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport


@contextmanager
def fail_together(transport: RankTransport) -> Iterator[None]:
    """Around a whole job on one rank: see the module's docstring."""
    try:
        yield
    except (AgreedInputError, PeerFailure, Preempted):
        raise  # agreed by every rank, told by the rank that failed, or every rank's checkpointed stop
    except TransportTimeout as exc:  # a peer that stopped answering (not a user's own timeout)
        end_stuck(transport, f"{exc}; ending the job")
        raise
    except BaseException as exc:
        try:
            transport.notify_failure(notice_text(exc))
        except Exception:  # noqa: BLE001 - a communicator that failed too: the error itself matters more
            get_logger().debug("the failure notice could not be sent", exc_info=True)
        raise


def end_stuck(transport: RankTransport, message: str) -> None:
    """A peer stopped answering: say so on this rank's console and log, and end every rank."""
    get_logger().error("%s", message)
    sys.stderr.write(f"mpi_trainer: error: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    transport.abort(EXIT_WORKER_FAILURE)
