"""A job on every rank: start the rank, place its process, set up, then train in its role.

Separation of concerns: :mod:`.agreement` makes every rank fail together on bad input;
:mod:`.process_placement` fixes this process's device, threads and cores once; :mod:`.job_setup` reads
the data and, on rank 0, builds the model and plans the job; :mod:`.roles` picks and runs the
scheduler engine or the worker. This module strings them together.

A process is placed by its first job (or :func:`mpi_trainer.init`): its backend cannot move after
that, so later jobs follow the same placement. :class:`ThisProcess` is what a caller keeps between
jobs for that; the entry points here take one explicitly, and use :data:`THIS_PROCESS`, the Python
process's own record, when none is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mpi_trainer import hooks
from mpi_trainer.comm.transport import Transport
from mpi_trainer.config import Config
from mpi_trainer.errors import EXIT_PREEMPTED, AgreedInputError
from mpi_trainer.launch.agreement import agree, check_fault_tolerance, check_world, load_config_everywhere
from mpi_trainer.launch.console import quiet_backend, report_error
from mpi_trainer.launch.devices import RankPlacement
from mpi_trainer.launch.job_setup import JobInputs, claim_run_dir, resolve_stream, setup
from mpi_trainer.launch.process_placement import PlacedProcess, place_or_follow
from mpi_trainer.launch.roles import train_roles
from mpi_trainer.launch.run_dir import finished_run
from mpi_trainer.launch.wire_choice import resolve_wire
from mpi_trainer.logs import setup_logging
from mpi_trainer.persistence.preemption import Preemption

# what mpi_trainer.fit and mpi_trainer.init call, in one place
__all__ = ["THIS_PROCESS", "AgreedInputError", "JobInputs", "ThisProcess", "agree", "load_config_everywhere",
           "quiet_backend", "report_error", "run_job", "start_rank"]


@dataclass
class ThisProcess:
    """What one Python process keeps between its jobs: the placement its first job chose."""

    placed: PlacedProcess | None = None


# The one record mpi_trainer keeps per Python process: a Keras backend reads its devices and sizes its
# thread pools once, when it starts, so every later job in this process follows the first one's placement.
THIS_PROCESS = ThisProcess()


def start_rank(transport: Transport, cfg: Config,
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


def run_job(transport: Transport, cfg: Config, inputs: JobInputs, run_dir: str | None, resume: bool,
            process: ThisProcess = THIS_PROCESS) -> Any:
    """Every rank's whole job; returns (the scheduler's engine, the summary) on rank 0, the worker (or
    None) elsewhere.

    A preempted job raises :class:`~mpi_trainer.errors.Preempted` on every rank (exit status 75).
    """
    run = claim_run_dir(transport, cfg, inputs, run_dir, resume)
    watch = Preemption()  # this job's: its signal handlers note a signal here, the roles read it
    try:
        cfg, placements = start_rank(transport, cfg, process)
        if transport.rank == 0 and inputs.why:
            from mpi_trainer.logs import get_logger

            get_logger().info("trained by the round engines, not as a keras.Model: %s", inputs.why)
        cfg = resolve_wire(transport, resolve_stream(transport, cfg))
        hooks.maybe_freeze(transport.rank, -1)
        watch.install(cfg.checkpoint.preempt_signals, cfg.checkpoint.grace_seconds,
                      lambda: transport.abort(EXIT_PREEMPTED))
        job = setup(transport, cfg, inputs, run)
        job.plan = transport.bcast_object(job.plan)
        if job.plan.finished:  # a complete run, and no more rounds asked for: every rank leaves
            return finished_run(job.run_directory, job.model) if transport.rank == 0 else None
        return train_roles(transport, cfg, inputs, job, placements, watch)
    finally:
        watch.uninstall()
        if run is not None:
            run.release()
