"""The two roles of a job: rank 0 hands the job to a scheduler engine, every other rank builds a worker.

:func:`pick_roles` is the one place that picks both from the config: the L-BFGS engine and workers for
``model.optimizer = "lbfgs"``, else the synchronous engine at ``aggregation.ssp = 0`` and the
stale-synchronous one above it, with the gradient-step :class:`~mpi_trainer.worker.Worker`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer import hooks
from mpi_trainer.comm.transport import Transport
from mpi_trainer.config import Config
from mpi_trainer.errors import PeerFailure, Preempted, WorkerFailure
from mpi_trainer.launch.agreement import agree_on_failure
from mpi_trainer.launch.devices import RankPlacement
from mpi_trainer.launch.fail_together import end_stuck
from mpi_trainer.launch.job_setup import JobInputs, JobSetup, log_plan, place_training_data
from mpi_trainer.launch.process_placement import log_placements
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.persistence.run_files import CONFIG_NAME, REPORT_NAME, write_atomic
from mpi_trainer.persistence.run_record import RunContext

if TYPE_CHECKING:
    from mpi_trainer.comm.messages import JobPlan
    from mpi_trainer.data.placement import WorkerData
    from mpi_trainer.data.sources import Dataset

# (worker class, transport, cfg, plan, dataset, worker data, the job's preemption state) -> worker
WorkerBuilder = Callable[[type, Transport, Config, "JobPlan", "Dataset | None", "WorkerData | None", Preemption], Any]


@dataclass(frozen=True)
class Roles:
    """Rank 0's engine class, the workers' class, and how a worker of that class is built."""

    engine: type
    worker: type
    build_worker: WorkerBuilder  # (worker class, transport, cfg, plan, dataset, worker data, preemption) -> worker


def pick_roles(cfg: Config) -> Roles:
    """The engine and worker classes for ``cfg`` (the ``async_engine`` test hook forces the stale-synchronous
    engine at ``ssp = 0``, for checks that both engines agree)."""
    if cfg.model.uses_lbfgs:
        from mpi_trainer.scheduler.lbfgs import LbfgsScheduler
        from mpi_trainer.worker.lbfgs import LbfgsWorker

        return Roles(LbfgsScheduler, LbfgsWorker, _full_batch_worker)
    from mpi_trainer.scheduler.stale_synchronous import StaleSynchronousEngine
    from mpi_trainer.scheduler.synchronous import SynchronousEngine
    from mpi_trainer.worker import Worker

    engine = StaleSynchronousEngine if cfg.aggregation.ssp > 0 or hooks.active().async_engine else SynchronousEngine
    return Roles(engine, Worker, _gradient_worker)


def _full_batch_worker(worker_type: type, transport: Transport, cfg: Config, plan: JobPlan, dataset: Dataset | None,
                       worker_data: WorkerData | None, preemption: Preemption) -> Any:
    """The L-BFGS worker (a preemption reaches it with the scheduler's stop request)."""
    from mpi_trainer.comm.protocol import WorkerLink
    from mpi_trainer.data.placement import HeldBlock

    held = placed_rows(worker_data)
    if not isinstance(held, HeldBlock):
        raise TypeError("an L-BFGS worker trains on rows in memory (the config refuses streamed inputs)")
    fixed_x, fixed_y = held.fixed_x, held.fixed_y
    return worker_type(WorkerLink(transport), plan, cfg, fixed_x, fixed_y)


def _gradient_worker(worker_type: type, transport: Transport, cfg: Config, plan: JobPlan, dataset: Dataset | None,
                     worker_data: WorkerData | None, preemption: Preemption) -> Any:
    """A worker seeded for its rank and round, dry-run on its first batch; its reports pass on ``preemption``."""
    import keras

    from mpi_trainer.comm.protocol import WorkerLink
    from mpi_trainer.persistence.resume import worker_seed

    keras.utils.set_random_seed(worker_seed(cfg.train.seed, transport.rank, plan.start_round))
    worker = worker_type(WorkerLink(transport), plan, dataset, cfg, worker_data, preemption)
    worker.preflight()
    return worker


def train_roles(transport: Transport, cfg: Config, inputs: JobInputs, job: JobSetup,
                placements: list[RankPlacement], preemption: Preemption) -> Any:
    """Place the data, start the roles, train; rank 0 returns (engine, summary), a worker itself.
    ``preemption``: the job's preemption state, which its signal handlers set."""
    worker_data, job.dataset = place_training_data(transport, cfg, job.dataset, job.job_plan)
    role = make_worker(transport, cfg, job.job_plan, job.dataset, worker_data, preemption)
    calibrating = time.perf_counter()
    speeds = calibrate_everywhere(transport, cfg, role)
    if transport.rank == 0:
        engine, summary = run_scheduler(transport, cfg, job, placements, inputs,
                                        (speeds, time.perf_counter() - calibrating), preemption)
        if summary.get("stop_reason") == "preempted":
            raise Preempted()
        result = engine, summary
    else:
        role.run()
        if getattr(role, "preempted", False):
            raise Preempted()
        result = role
    transport.phase = "teardown"
    transport.barrier()  # every rank leaves the job together; a rank stuck past its last round is named
    return result


def placed_rows(worker_data: WorkerData | None) -> WorkerData:
    """A worker rank's training rows, which :func:`place_training_data` gives every worker."""
    if worker_data is None:
        raise RuntimeError("a worker rank has no training rows placed")
    return worker_data


def make_worker(transport: Transport, cfg: Config, plan: JobPlan, dataset: Dataset | None,
                worker_data: WorkerData | None, preemption: Preemption | None = None) -> Any:
    """A worker rank's role, dry-run on its first batch; every rank agrees that all of them passed.

    Bad input fails every rank with one line; a bug in the user's model (any other exception) also
    fails every rank, and the rank where it happened shows its traceback."""
    role, failure = None, None
    try:
        if transport.rank != 0:
            roles = pick_roles(cfg)
            role = roles.build_worker(roles.worker, transport, cfg, plan, dataset, worker_data,
                                      preemption or Preemption())
    except Exception as exc:  # noqa: BLE001 - agreed on by every rank, then raised again where it happened
        failure = exc
    agree_on_failure(transport, failure)
    return role


def calibrate_everywhere(transport: Transport, cfg: Config, role: Any) -> dict[int, Any]:
    """``data.rebalance``: each worker times a few steps; every rank gets ``{worker rank: speed}``.

    The scheduler cuts round 0's blocks from them (:meth:`Engine.seed_speeds`).
    """
    if not cfg.data.rebalance or cfg.model.uses_lbfgs:
        return {}
    speeds = transport.allgather(role.calibrate() if transport.rank != 0 else None)
    return {rank: speed for rank, speed in enumerate(speeds) if speed is not None}


def run_scheduler(transport: Transport, cfg: Config, job: JobSetup, placements: list[RankPlacement],
                  inputs: JobInputs | None = None, calibration: tuple[Mapping[int, Any], float] = ({}, 0.0),
                  preemption: Preemption | None = None) -> Any:
    """Rank 0's part; returns the engine and the run's summary. A watchdog failure ends the whole job
    with a one-line message, not a traceback. ``calibration``: the workers' timed steps for
    rebalancing, and the seconds they took; ``preemption``: the job's preemption state."""
    from mpi_trainer.comm.protocol import SchedulerLink

    path = job.run_directory.path
    write_atomic(path / CONFIG_NAME, cfg.to_toml())
    log_placements(placements)
    log_plan(job.job_plan, job.placed_dataset)
    if job.job_plan.model.user_compiled:
        get_logger().info("the model function compiled the model: its own optimizer, loss and metrics are used "
                          "(model.optimizer, model.loss and model.metrics do not apply)")
    hosts = [placement.host for placement in placements]
    try:
        inputs = inputs or JobInputs()
        # Keras callbacks and the History fit returns, except under L-BFGS (it has no Keras rounds)
        context = RunContext(placement=tuple(placement.as_dict() for placement in placements),
                             fingerprint=job.run_directory.fingerprint,
                             callbacks=None if cfg.model.uses_lbfgs else tuple(inputs.callbacks),
                             initial_epoch=inputs.initial_epoch, preemption=preemption)
        engine = pick_roles(cfg).engine(SchedulerLink(transport), cfg, job.dataset, job.model, job.plan, path,
                                        hosts, job.state, context)
        if calibration[0]:  # data.rebalance (which L-BFGS refuses)
            engine.seed_speeds(*calibration)
        summary = engine.run()
    except PeerFailure:
        raise  # a worker failed and left the job: rank 0 leaves it too, with the worker's error
    except WorkerFailure as exc:  # a worker stopped answering: only ending the job ends it
        end_stuck(transport, str(exc))
    if cfg.log.plots and summary.get("completed", True):
        write_report(path)
    print(f"run directory: {path}", flush=True)
    return engine, summary


def write_report(run_dir: Path) -> None:
    """The end-of-run plots and report.txt; a plotting failure is logged, the run stays a success."""
    from mpi_trainer.reporting.report import make_report

    log = get_logger()
    try:
        result = make_report(run_dir)
    except Exception as exc:  # the run's files are complete; only the pictures are missing
        log.warning("the report could not be written (%s: %s); run `mpi_trainer report %s` to retry",
                    type(exc).__name__, exc, run_dir, exc_info=True)
        return
    log.info("report: %s and %d plots in %s", result.run_dir / REPORT_NAME, len(result.plots), run_dir)
