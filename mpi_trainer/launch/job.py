"""Set-up shared by every rank, then hand-over to the scheduler or worker role.

Set-up errors (bad data, an unbuildable model, an unusable run directory) are
caught on the rank where they happen and agreed on with one ``allgather``:
then every rank prints the message and exits non-zero, and none is left
waiting for a peer that has already gone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

from mpi_trainer.comm.transport import Transport, install_abort_on_error
from mpi_trainer.config import Config, load_config
from mpi_trainer.errors import EXIT_INPUT_ERROR, EXIT_WORKER_FAILURE, ConfigError, InputError, WorkerFailure
from mpi_trainer.launch.devices import (
    Placement,
    backend_environment,
    backend_sees_gpu,
    check_backend,
    choose_placement,
    configured_backend,
    confirm_placement,
    discover_gpus,
)
from mpi_trainer.launch.runtime import configure_threads, threads_for_rank, usable_cores
from mpi_trainer.logs import add_log_file, get_logger, setup_logging
from mpi_trainer.persistence.run_files import CONFIG_NAME, LOG_NAME, REPORT_NAME, ROUNDS_NAME, write_atomic


def default_run_dir(config_path: str | None) -> Path:
    stem = Path(config_path).stem if config_path else "run"
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_run_dir(run_dir: Path, cfg: Config, resume: bool = False) -> Path:
    if not resume and (run_dir / ROUNDS_NAME).exists():
        raise ConfigError(f"Run directory already holds a run. Received: --run-dir {str(run_dir)!r}; "
                          f"expected a new or empty directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"Cannot create the run directory {str(run_dir)!r}: {exc}") from None
    write_atomic(run_dir / CONFIG_NAME, cfg.to_toml())
    add_log_file(run_dir / LOG_NAME)
    return run_dir


def uses_lbfgs(cfg: Config) -> bool:
    """``model.optimizer = "lbfgs"``: the full-batch L-BFGS engine and workers replace the usual roles."""
    return cfg.model.uses_lbfgs


def check_world(transport: Transport) -> None:
    if transport.size < 2:
        raise ConfigError("mpi_trainer needs at least one worker rank besides the scheduler (rank 0). "
                          f"Received: {transport.size} rank; expected mpirun -n 2 or more")


class AgreedInputError(InputError):
    """Bad input that every rank knows about: all of them report it and exit together."""


def agree(transport: Transport, error: str | None) -> None:
    """Every rank learns whether any rank failed set-up; all fail together if so."""
    errors = transport.allgather(error)
    failed = [(rank, text) for rank, text in enumerate(errors) if text]
    if not failed:
        return
    rank, text = failed[0]
    where = "" if rank == transport.rank else f" (reported by rank {rank})"
    raise AgreedInputError(f"{text}{where}")


def resume_state(run_dir: str | None, cfg: Config) -> Any:
    """The checkpoint state ``train --resume`` continues from (None: nothing to resume, start over)."""
    from mpi_trainer.persistence.resume import load_resume_state

    if not run_dir:
        raise ConfigError("`--resume` needs the run directory to continue. Received: no --run-dir; "
                          "expected --run-dir DIR of an earlier run")
    return load_resume_state(Path(run_dir), cfg.to_dict())


def setup(transport: Transport, cfg: Config, config_path: str | None, run_dir: str | None,
          resume: bool = False) -> tuple:
    """Load data everywhere and build the model on rank 0; returns (dataset, model, plan, run_dir, state)."""
    import keras

    from mpi_trainer.comm.protocol import JobPlan
    from mpi_trainer.data.partition import block_bounds
    from mpi_trainer.models import build_model
    from mpi_trainer.models.gradients import BlockGradient, check_backend
    from mpi_trainer.persistence.resume import check_weight_count
    from mpi_trainer.worker.slowdown import check_slow_ranks

    dataset = model = plan = path = state = None
    error = None
    try:
        check_slow_ranks(cfg.debug, transport.size)
        if uses_lbfgs(cfg):
            check_backend()  # every rank: each computes with its own backend
        dataset = load_dataset_for_rank(transport.rank, cfg)
        if dataset is not None:
            bounds = block_bounds(dataset.num_train, transport.workers)  # every reader fails alike
        if transport.rank == 0:
            keras.utils.set_random_seed(cfg.train.seed)
            state = resume_state(run_dir, cfg) if resume else None
            model, spec = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
            if uses_lbfgs(cfg):
                BlockGradient(model)  # a loss it cannot differentiate fails here, on every rank
            if state is not None:
                check_weight_count(state, sum(int(w.size) for w in model.get_weights()), cfg.model.name)
            # Blocks are always planned for the workers present now: a resume may have fewer or more.
            plan = JobPlan(cfg.to_dict(), spec, bounds, cfg.train.seed, dataset.num_train,
                           state.next_round if state else 0)
            path = prepare_run_dir(Path(run_dir) if run_dir else default_run_dir(config_path), cfg, resume)
    except (InputError, ValueError, OSError) as exc:
        error = str(exc)
    agree(transport, error)
    return dataset, model, plan, path, state


def check(cfg: Config, workers: int | None = None) -> str:
    """Validate without MPI: load the data and build the model; return a one-line description."""
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.partition import block_bounds
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.models import build_model

    check_backend(configured_backend(), backend_installed)
    dataset = load_dataset(cfg.data, cfg.train.seed)
    check_image_input(cfg.data.augmentation, dataset.input_shape)
    model, _ = build_model(cfg.model, dataset.input_shape, dataset.num_classes)
    if uses_lbfgs(cfg):
        from mpi_trainer.models.gradients import BlockGradient

        BlockGradient(model)
    if workers is not None:
        try:
            block_bounds(len(dataset.x_train), workers)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return f"{dataset.describe()}; model {cfg.model.name} with {model.count_params()} parameters"


def load_dataset_for_rank(rank: int, cfg: Config) -> Any:
    """The scheduler reads validation and test features; a worker only what it scores on.

    Under ``data.placement = "scatter"`` a worker reads nothing (its node may
    not see the file): its rows arrive from the scheduler after set-up.
    """
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.sources import load_dataset

    scatter = cfg.data.placement == "scatter"
    if rank != 0 and scatter:
        return None
    scores = rank == 0 or cfg.aggregation.elects
    dataset = load_dataset(cfg.data, cfg.train.seed, read_val=scores, read_test=rank == 0)
    check_image_input(cfg.data.augmentation, dataset.input_shape)
    if scatter:
        dataset.train.check_all()  # bad rows must fail here, not half-way through sending blocks
    return dataset


def place_training_data(transport: Transport, cfg: Config, dataset: Any, plan: Any) -> tuple[Any, Any]:
    """Workers get their training rows (shared file or scatter); any failure fails every rank.

    Returns (the worker's data or None on rank 0, the dataset this rank goes on with).
    The scheduler's own scatter errors are not caught: a failure half-way through
    sending would leave workers waiting for blocks, so it takes the abort path.
    """
    from mpi_trainer.comm.protocol import SchedulerLink, WorkerLink
    from mpi_trainer.data.placement import place_data

    link = SchedulerLink(transport) if transport.rank == 0 else WorkerLink(transport)
    sender = transport.rank == 0 and cfg.data.placement == "scatter"
    placed, error = (None, dataset), None
    try:
        placed = place_data(link, transport.rank, cfg, dataset, plan)
    except (InputError, ValueError) as exc:
        if sender:
            raise RuntimeError(f"scatter failed on the scheduler: {exc}") from exc
        error = str(exc)
    transport.barrier()  # a polling wait while workers read their blocks, then a quick agreement
    agree(transport, error)
    return placed


def log_plan(plan: Any, dataset: Any) -> None:
    log = get_logger()
    log.info("dataset %s", dataset.describe())
    if dataset.class_names:
        log.info("%s: string labels mapped to classes: %s", dataset.name, dataset.label_mapping())
    for index, (start, end) in enumerate(plan.block_bounds):
        log.info("worker rank %d: block start %d end %d size %d", index + 1, start, end, end - start)


def log_placements(placements: list[Placement]) -> None:
    log = get_logger()
    for placement in placements:
        why = f" (aggregates in NumPy, evaluates on {placement.device})" if placement.role == "scheduler" else ""
        log.info("%s%s", placement.describe(), why)


def run_scheduler(transport: Transport, cfg: Config, setup_result: tuple, placements: list[Placement]) -> None:
    """Rank 0's part; a watchdog failure ends the whole job with a one-line message, not a traceback."""
    from mpi_trainer.comm.protocol import SchedulerLink
    from mpi_trainer.scheduler import engine_class
    from mpi_trainer.scheduler.lbfgs import LbfgsScheduler

    dataset, model, plan, path, state = setup_result
    log_placements(placements)
    log_plan(plan, dataset)
    hosts = [placement.host for placement in placements]
    engine_type = LbfgsScheduler if uses_lbfgs(cfg) else engine_class(cfg)
    try:
        engine = engine_type(SchedulerLink(transport), cfg, dataset, model, plan, path, hosts, state)
        engine.record_placement([placement.as_dict() for placement in placements])
        engine.run()
    except WorkerFailure as exc:
        get_logger().error("%s", exc)
        sys.stderr.write(f"mpi_trainer: error: {exc}\n")
        sys.stderr.flush()
        transport.abort(EXIT_WORKER_FAILURE)
    if cfg.log.plots:
        write_report(path)
    print(f"run directory: {path}", flush=True)


def write_report(run_dir: Path) -> None:
    """The end-of-run plots and report.txt; a plotting failure is logged, the run stays a success."""
    from mpi_trainer.reporting.report import make_report

    log = get_logger()
    try:
        result = make_report(run_dir)
    except Exception as exc:  # the run's files are complete; only the pictures are missing
        log.warning("the report could not be written (%s: %s); run `mpi_trainer report %s` to retry",
                    type(exc).__name__, exc, run_dir)
        return
    log.info("report: %s and %d plots in %s", result.run_dir / REPORT_NAME, len(result.plots), run_dir)


def load_config_everywhere(transport: Transport, config_path: str, overrides: list[str]) -> Config:
    """Every rank reads the config; an error on any rank fails all of them, each with the message."""
    cfg, error = None, None
    try:
        cfg = load_config(config_path, overrides)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return cfg


def train(config_path: str, overrides: list[str], run_dir: str | None, resume: bool = False) -> int:
    """Entry for ``mpi_trainer train`` on every rank; returns the exit code."""
    transport = Transport()
    try:
        return train_job(transport, config_path, overrides, run_dir, resume)
    except AgreedInputError as exc:
        report_error(exc)
        # Every rank prints before any exits: mpirun ends the job when the first rank leaves.
        transport.barrier()
        return EXIT_INPUT_ERROR


def train_job(transport: Transport, config_path: str, overrides: list[str], run_dir: str | None,
              resume: bool) -> int:
    cfg = load_config_everywhere(transport, config_path, overrides)
    transport.max_sleep = cfg.comm.poll_interval
    setup_logging(transport.rank, transport.size, transport.host, cfg.log.verbosity)
    check_world(transport)
    install_abort_on_error(transport)
    node_cores, node_ranks = transport.node_layout()
    placement = place_rank(transport, cfg, node_ranks)  # before anything imports the backend
    threads = threads_for_rank(transport.rank, node_cores, node_ranks, usable_cores())
    configure_threads(threads)
    get_logger().debug("%d threads (%d cores, ranks on this node: %s)", threads, node_cores, node_ranks)
    placements = confirm_rank(transport, cfg, placement)
    dataset, model, plan, path, state = setup(transport, cfg, config_path, run_dir, resume)
    plan = transport.bcast_object(plan)
    worker_data, dataset = place_training_data(transport, cfg, dataset, plan)
    if transport.rank == 0:
        run_scheduler(transport, cfg, (dataset, model, plan, path, state), placements)
    elif uses_lbfgs(cfg):
        from mpi_trainer.comm.protocol import WorkerLink
        from mpi_trainer.worker.lbfgs import LbfgsWorker

        LbfgsWorker(WorkerLink(transport), plan, cfg, worker_data.fixed_x, worker_data.fixed_y).run()
    else:
        import keras

        from mpi_trainer.comm.protocol import WorkerLink
        from mpi_trainer.persistence.resume import worker_seed
        from mpi_trainer.worker import Worker

        keras.utils.set_random_seed(worker_seed(cfg.train.seed, transport.rank, plan.start_round))
        Worker(WorkerLink(transport), plan, dataset, cfg, worker_data).run()
    return 0


def backend_installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def place_rank(transport: Transport, cfg: Config, node_ranks: list[int]) -> Placement:
    """Choose this rank's device and narrow the visible GPUs to it; a rank that cannot fails them all."""
    placement, error = None, None
    try:
        backend = configured_backend()
        check_backend(backend, backend_installed)
        placement = choose_placement(transport.rank, transport.host, node_ranks, cfg.train.device,
                                     cfg.train.scheduler_device, discover_gpus(), backend)
        os.environ.update(backend_environment(placement))
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return placement


def confirm_rank(transport: Transport, cfg: Config, placement: Placement) -> list[Placement]:
    """Check that each GPU rank's backend sees its GPU; every rank learns where every rank runs."""
    error = None
    try:
        requested = cfg.train.scheduler_device if placement.role == "scheduler" else cfg.train.device
        placement = confirm_placement(placement, requested, backend_sees_gpu)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return transport.allgather(placement)


def quiet_backend() -> None:
    """Keep TensorFlow's C++ start-up chatter off the console unless the user asked for it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # oneDNN's reordered float arithmetic makes repeated runs differ slightly; on CPU it made no
    # measurable speed difference for LeNet here (281 vs 277 samples/s), so runs stay repeatable.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def report_error(exc: BaseException) -> int:
    sys.stderr.write(f"mpi_trainer: error: {exc}\n")
    sys.stderr.flush()
    return EXIT_INPUT_ERROR
