"""Set-up errors agreed on by every rank, so that all fail together and none is left waiting.

A set-up error (bad config, bad data, an unbuildable model, an unusable run directory) is caught on
the rank where it happens and agreed on with one ``allgather``: then every rank raises
:class:`~mpi_trainer.errors.AgreedInputError` with the message, and none waits for a peer that has
already gone. Any other exception (a bug in the user's model or in a library) is not caught: it
reaches the user with its traceback, and the job's failure notices end the other ranks.
"""

from __future__ import annotations

from typing import Any, TypeVar

from mpi_trainer.algorithms.wait_bounds import WaitBounds, for_rank
from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.comm.transport import fault_tolerance_problem
from mpi_trainer.config import Config, load_config
from mpi_trainer.errors import AgreedInputError, ConfigError, InputError
from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS


def agree(transport: RankTransport, error: str | None) -> None:
    """Every rank learns whether any rank failed set-up; all fail together if so."""
    errors = transport.allgather(error)
    failed = [(rank, text) for rank, text in enumerate(errors) if text]
    if not failed:
        return
    rank, text = failed[0]
    where = "" if rank == transport.rank else f" (reported by rank {rank})"
    raise AgreedInputError(f"{text}{where}")


Agreed = TypeVar("Agreed")


def agreed(value: Agreed | None) -> Agreed:
    """What this rank's set-up step produced, once :func:`agree` has passed: a step that produced nothing
    reported an error, and then :func:`agree` raised on every rank."""
    if value is None:
        raise RuntimeError("a set-up step that every rank agreed had passed produced nothing")
    return value


def load_config_everywhere(transport: RankTransport, config: str | dict | None, overrides: list[Any]) -> Config:
    """Every rank reads the config; an error on any rank fails all of them, each with the message."""
    cfg, error = None, None
    try:
        cfg = load_config(config, overrides)
        # set-up waits follow watchdog.setup_timeout from here on, the agreement below included
        transport.bound = for_rank(transport.rank, WaitBounds(cfg.watchdog.setup_timeout).setup)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return agreed(cfg)


def check_world(transport: RankTransport) -> None:
    if transport.size < 2:
        raise ConfigError("mpi_trainer needs at least one worker rank besides the scheduler (rank 0). "
                          f"Received: {transport.size} rank; expected mpirun -n 2 or more")


def check_fault_tolerance(transport: RankTransport, cfg: Config) -> None:
    """``fault.survive`` needs ULFM in the MPI library and on the mpirun line: every rank fails before
    training, saying what is missing, when either lacks it."""
    problem = fault_tolerance_problem() if cfg.fault.survive else None
    if problem:
        problem = (f"`fault.survive` = True needs fault-tolerant MPI, but {problem}. Start the job with "
                   f"`python -m mpi_trainer launch`, or add `{' '.join(FAULT_TOLERANT_OPTIONS)}` to the mpirun "
                   f"line, or set fault.survive = false")
    agree(transport, problem)
