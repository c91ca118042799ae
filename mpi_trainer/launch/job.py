"""The start of a job on every rank: its log, its world, then this process placed.

Separation of concerns: :mod:`.agreement` makes every rank fail together on bad input;
:mod:`.process_placement` fixes this process's device, threads and cores once; the fit
(:mod:`mpi_trainer.trainer`) does the rest.

A process is placed by its first job (or :func:`mpi_trainer.init`): its backend cannot move after
that, so later jobs follow the same placement. :class:`ThisProcess` is what a caller keeps between
jobs for that; the entry points here take one explicitly, and use :data:`THIS_PROCESS`, the Python
process's own record, when none is given.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.config import Config
from mpi_trainer.errors import AgreedInputError
from mpi_trainer.launch.agreement import agree, check_fault_tolerance, check_world, load_config_everywhere
from mpi_trainer.launch.console import quiet_backend, report_error
from mpi_trainer.launch.devices import RankPlacement
from mpi_trainer.launch.process_placement import PlacedProcess, place_or_follow
from mpi_trainer.logs import setup_logging

# what mpi_trainer.fit and mpi_trainer.init call, in one place
__all__ = ["THIS_PROCESS", "AgreedInputError", "ThisProcess", "agree", "load_config_everywhere",
           "quiet_backend", "report_error", "start_rank"]


@dataclass
class ThisProcess:
    """What one Python process keeps between its jobs: the placement its first job chose."""

    placed: PlacedProcess | None = None


# The one record mpi_trainer keeps per Python process: a Keras backend reads its devices and sizes its
# thread pools once, when it starts, so every later job in this process follows the first one's placement.
THIS_PROCESS = ThisProcess()


def start_rank(transport: RankTransport, cfg: Config,
               process: ThisProcess = THIS_PROCESS) -> tuple[Config, list[RankPlacement]]:
    """Logging, the world's size, then this process's device and threads (chosen the first time; checked
    against ``cfg`` after that). Returns ``cfg`` and every rank's placement. The caller's scope ends the
    job on an uncaught error (:func:`~mpi_trainer.comm.failures.abort_on_error`)."""
    transport.max_sleep = cfg.comm.poll_interval
    setup_logging(transport.rank, transport.size, transport.host, cfg.log.verbosity)
    check_world(transport)
    check_fault_tolerance(transport, cfg)
    transport.learn_hosts()
    cfg, process.placed = place_or_follow(transport, cfg, process.placed)
    return cfg, process.placed.placements
