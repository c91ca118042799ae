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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.early_stopping import watched_metric
from mpi_trainer.algorithms.wait_bounds import WaitBounds, for_rank
from mpi_trainer.comm.transport import PeerFailure, Transport, fault_tolerance_problem, install_abort_on_error
from mpi_trainer.config import Config, load_config
from mpi_trainer.config.schema import TrainConfig
from mpi_trainer.data.readers import RawArrays
from mpi_trainer.errors import (
    EXIT_INPUT_ERROR,
    EXIT_PREEMPTED,
    AgreedInputError,
    ConfigError,
    InputError,
    Preempted,
    WorkerFailure,
)
from mpi_trainer.hooks import maybe_freeze
from mpi_trainer.launch.devices import (
    Placement,
    backend_environment,
    backend_sees_gpu,
    backend_started,
    check_backend,
    choose_placement,
    configured_backend,
    confirm_placement,
    discover_gpus,
    refuse_started_backend,
)
from mpi_trainer.launch.failures import end_stuck
from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS
from mpi_trainer.launch.run_dir import (
    RunDirectory,
    begin_writing,
    check_against_run,
    finished_run,
    open_run_dir,
)
from mpi_trainer.launch.runtime import (
    allowed_cores,
    configure_threads,
    threads_for_rank,
    usable_cores,
    worker_cores,
)
from mpi_trainer.logs import get_logger, setup_logging
from mpi_trainer.persistence.preemption import preemption
from mpi_trainer.persistence.run_files import CONFIG_NAME, REPORT_NAME, write_atomic


@dataclass
class JobInputs:
    """What a Python caller hands the job besides the config (see :func:`mpi_trainer.fit`)."""

    arrays: RawArrays | None = None  # the data as arrays, instead of data.source
    builder: Any = None  # a model function or a built model, instead of model.name
    callbacks: Sequence[Any] = ()  # Keras callbacks, run on rank 0 once per round
    config_path: str | None = None  # names the default run directory
    pipeline: Any = None  # an input adapter (tf.data, PyDataset, generator...), instead of arrays
    validation: Any = None  # the pipeline's validation_data, read by the ranks that score
    class_weight: dict[int, float] | None = None  # fit's class_weight, for the workers' training loss
    initial_epoch: int = 0  # fit's initial_epoch: the callbacks' epoch of round 0


def uses_lbfgs(cfg: Config) -> bool:
    """``model.optimizer = "lbfgs"``: the full-batch L-BFGS engine and workers replace the usual roles."""
    return cfg.model.uses_lbfgs


def check_world(transport: Transport) -> None:
    if transport.size < 2:
        raise ConfigError("mpi_trainer needs at least one worker rank besides the scheduler (rank 0). "
                          f"Received: {transport.size} rank; expected mpirun -n 2 or more")


def check_fault_tolerance(transport: Transport, cfg: Config) -> None:
    """``fault.survive`` needs ULFM in the MPI library and on the mpirun line: every rank fails before
    training, saying what is missing, when either lacks it."""
    problem = fault_tolerance_problem() if cfg.fault.survive else None
    if problem:
        problem = (f"`fault.survive` = True needs fault-tolerant MPI, but {problem}. Start the job with "
                   f"`python -m mpi_trainer launch`, or add `{' '.join(FAULT_TOLERANT_OPTIONS)}` to the mpirun "
                   f"line, or set fault.survive = false")
    agree(transport, problem)


def agree(transport: Transport, error: str | None) -> None:
    """Every rank learns whether any rank failed set-up; all fail together if so."""
    errors = transport.allgather(error)
    failed = [(rank, text) for rank, text in enumerate(errors) if text]
    if not failed:
        return
    rank, text = failed[0]
    where = "" if rank == transport.rank else f" (reported by rank {rank})"
    raise AgreedInputError(f"{text}{where}")


def claim_run_dir(transport: Transport, cfg: Config, inputs: JobInputs, run_dir: str | None,
                  resume: bool) -> RunDirectory | None:
    """Rank 0 locks and reads the run directory before anything slow (the backend's start), so that a
    second job on it is refused at once, on every rank. Rank 0 gets its :class:`RunDirectory`."""
    run, error = None, None
    if transport.rank == 0:
        try:
            run = open_run_dir(run_dir, inputs.config_path, cfg, resume)
        except (InputError, ValueError, OSError) as exc:
            error = str(exc)
    agree(transport, error)
    return run


def setup(transport: Transport, cfg: Config, inputs: JobInputs, run: RunDirectory | None) -> tuple:
    """Load data everywhere; on rank 0 build the model and check it against the run directory's run.

    Returns (dataset, model, plan, state). Nothing in the directory is written before every rank
    has passed its checks (see :mod:`.run_dir`).
    """
    from mpi_trainer.data.partition import block_bounds
    from mpi_trainer.models.gradients import gradient_backend
    from mpi_trainer.worker.slowdown import check_slow_ranks

    dataset = model = plan = None
    error = None
    try:
        check_slow_ranks(cfg.debug, transport.size)
        if uses_lbfgs(cfg):
            gradient_backend()  # every rank: each computes with its own backend
        dataset = load_dataset_for_rank(transport.rank, cfg, inputs.arrays, transport.workers, inputs)
        if dataset is not None:  # every reader fails alike
            bounds = (dataset.train.block_bounds(transport.workers) if hasattr(dataset.train, "block_bounds")
                      else block_bounds(dataset.num_train, transport.workers))
        if transport.rank == 0:
            model, plan = plan_job(cfg, dataset, inputs, bounds, run.state)
            check_against_run(run, cfg, dataset, model)
            plan.finished = run.finished
    except (InputError, ValueError, OSError) as exc:
        error = str(exc)
    agree(transport, error)
    if run is not None:
        begin_writing(run)
    return dataset, model, plan, None if run is None else run.state


def plan_job(cfg: Config, dataset: Any, inputs: JobInputs, bounds: list, state: Any) -> tuple[Any, Any]:
    """Rank 0: build the model, dry-run it on the first training rows, and plan the job."""
    import keras

    from mpi_trainer.comm.protocol import JobPlan
    from mpi_trainer.data.weights import check_class_coverage
    from mpi_trainer.models import build_model
    from mpi_trainer.models.dry_run import SAMPLES, dry_run
    from mpi_trainer.models.gradients import BlockGradient

    keras.utils.set_random_seed(cfg.train.seed)
    model, spec = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes, inputs.builder)
    if uses_lbfgs(cfg):
        BlockGradient(model)  # a loss it cannot differentiate fails here, on every rank
    metric_names = dry_run(model, *dataset.train.read(np.arange(min(SAMPLES, dataset.num_train))))
    check_monitor(cfg, metric_names, len(dataset.y_test) > 0)
    # Blocks are always planned for the workers present now: a resume may have fewer or more.
    check_class_coverage(inputs.class_weight, dataset.num_outputs, dataset.classes)
    plan = JobPlan(cfg.to_dict(), spec, bounds, cfg.train.seed, dataset.num_train,
                   state.next_round if state else 0, metric_names, class_weight=inputs.class_weight)
    return model, plan


def check_monitor(cfg: Config, metric_names: list[str], has_test: bool = True) -> None:
    """``early_stopping.monitor`` must name a metric the compiled model reports, on a split that exists."""
    watched_metric(cfg.early_stopping.monitor, cfg.early_stopping.patience, metric_names, has_test)


def check(cfg: Config, workers: int | None = None) -> str:
    """Validate without MPI: load the data and build the model; return a one-line description."""
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.partition import block_bounds
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.models import build_model

    check_backend(configured_backend(), backend_installed)
    dataset = streamed_dataset(0, cfg, 1, None) or load_dataset(cfg.data, cfg.train.seed)
    check_image_input(cfg.data.augmentation, dataset.input_shape)
    model, _ = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes)
    if uses_lbfgs(cfg):
        from mpi_trainer.models.gradients import BlockGradient

        BlockGradient(model)
    from mpi_trainer.models.dry_run import SAMPLES, dry_run

    check_monitor(cfg, dry_run(model, *dataset.train.read(np.arange(min(SAMPLES, dataset.num_train)))))
    if workers is not None:
        try:
            block_bounds(dataset.num_train, workers)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return f"{dataset.describe()}; model {cfg.model.name} with {model.count_params()} parameters"


def load_dataset_for_rank(rank: int, cfg: Config, arrays: RawArrays | None = None, workers: int = 1,
                          inputs: JobInputs | None = None) -> Any:
    """The scheduler reads validation and test features; a worker only what it scores on.

    Under ``data.placement = "scatter"`` a worker reads nothing (its node may
    not see the file): its rows arrive from the scheduler after set-up.
    A pipeline (``inputs.pipeline``) or a streamed file keeps its training part where it is.
    """
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.sources import load_dataset

    streamed = streamed_dataset(rank, cfg, workers, inputs)
    if streamed is not None:
        check_image_input(cfg.data.augmentation, streamed.input_shape)
        return streamed
    scatter = cfg.data.scatters
    if rank != 0 and scatter:
        return None
    on_workers = cfg.evaluation.on_workers
    scores = rank == 0 or cfg.aggregation.elects or on_workers
    # under evaluation.where = "workers" a worker reads only its part of the test split
    read_test = True if rank == 0 else (rank - 1, workers) if on_workers else False
    dataset = load_dataset(cfg.data, cfg.train.seed, read_val=scores, read_test=read_test, arrays=arrays)
    check_image_input(cfg.data.augmentation, dataset.input_shape)
    if scatter:
        dataset.train.check_all()  # bad rows must fail here, not half-way through sending blocks
    return dataset


def streamed_dataset(rank: int, cfg: Config, workers: int, inputs: JobInputs | None) -> Any:
    """The dataset of a pipeline input, or None; what the config asks of it is checked first."""
    from mpi_trainer.data.streamed import check_allows, pipeline_dataset

    adapter, validation, name = (None, None, "") if inputs is None else (inputs.pipeline, inputs.validation, "")
    if cfg.data.is_image_folder or cfg.data.is_tfrecord:
        from mpi_trainer.data.adapters.records import image_folder, tfrecords

        adapter, validation = (image_folder if cfg.data.is_image_folder else tfrecords)(cfg)
        name = Path(cfg.data.source).name
    if cfg.data.stream:
        from mpi_trainer.data.adapters.files import stream_dataset

        dataset = stream_dataset(cfg.data)
        check_allows(cfg, dataset.train.adapter)
        return dataset
    if adapter is None:
        return None
    check_allows(cfg, adapter)
    scores = rank == 0 or cfg.aggregation.elects or cfg.evaluation.where == "workers"
    return pipeline_dataset(name or adapter.kind, adapter, validation, cfg, workers, read_val=scores,
                            read_test=rank == 0 or cfg.evaluation.where == "workers",
                            keras_validation=inputs is not None and inputs.pipeline is adapter)


def place_training_data(transport: Transport, cfg: Config, dataset: Any, plan: Any) -> tuple[Any, Any]:
    """Workers get their training rows (shared file or scatter); any failure fails every rank.

    Returns (the worker's data or None on rank 0, the dataset this rank goes on with).
    The scheduler's own scatter errors are not caught: a failure half-way through
    sending would leave workers waiting for blocks, so it takes the abort path.
    """
    from mpi_trainer.comm.protocol import SchedulerLink, WorkerLink
    from mpi_trainer.data.placement import place_data

    link = SchedulerLink(transport) if transport.rank == 0 else WorkerLink(transport)
    sender = transport.rank == 0 and cfg.data.scatters
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
    unit = getattr(getattr(dataset.train, "adapter", None), "unit", "samples")
    for index, (start, end) in enumerate(plan.block_bounds):
        log.info("worker rank %d: block start %d end %d size %d%s", index + 1, start, end, end - start,
                 "" if unit == "samples" else f" {unit}")


def log_placements(placements: list[Placement]) -> None:
    log = get_logger()
    for placement in placements:
        why = f" (aggregates in NumPy, evaluates on {placement.device})" if placement.role == "scheduler" else ""
        log.info("%s%s%s", placement.describe(), ", the backend's own threads" if placement.threads is None else "",
                 why)
    unsized = [p.rank for p in placements if p.threads is None]
    if unsized:
        log.warning("ranks %s: the Keras backend had started before the job could size its threads (the script "
                    "built or ran a model first), so each keeps the backend's default pools, which may "
                    "oversubscribe the cores; call mpi_trainer.init() at the top of the script, before Keras "
                    "builds anything", ", ".join(map(str, unsized)))


def run_scheduler(transport: Transport, cfg: Config, setup_result: tuple, placements: list[Placement],
                  inputs: JobInputs | None = None, calibration: tuple[Mapping[int, Any], float] = ({}, 0.0)) -> Any:
    """Rank 0's part; returns the engine and the run's summary. A watchdog failure ends the whole job
    with a one-line message, not a traceback. ``calibration``: the workers' timed steps for
    rebalancing, and the seconds they took."""
    from mpi_trainer.comm.protocol import SchedulerLink
    from mpi_trainer.scheduler import engine_class

    dataset, model, plan, run, state = setup_result
    path = run.path
    write_atomic(path / CONFIG_NAME, cfg.to_toml())
    log_placements(placements)
    log_plan(plan, dataset)
    if plan.model.user_compiled:
        get_logger().info("the model function compiled the model: its own optimizer, loss and metrics are used "
                          "(model.optimizer, model.loss and model.metrics do not apply)")
    hosts = [placement.host for placement in placements]
    engine_type = engine_class(cfg)
    try:
        engine = engine_type(SchedulerLink(transport), cfg, dataset, model, plan, path, hosts, state)
        (engine.recorder if hasattr(engine, "recorder") else engine).fingerprint = run.fingerprint
        engine.record_placement([placement.as_dict() for placement in placements])
        if not uses_lbfgs(cfg):  # Keras callbacks, and the History fit returns
            inputs = inputs or JobInputs()
            engine.recorder.use_callbacks(list(inputs.callbacks), inputs.initial_epoch)
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
                    type(exc).__name__, exc, run_dir)
        return
    log.info("report: %s and %d plots in %s", result.run_dir / REPORT_NAME, len(result.plots), run_dir)


def load_config_everywhere(transport: Transport, config: str | dict | None, overrides: list[Any]) -> Config:
    """Every rank reads the config; an error on any rank fails all of them, each with the message."""
    cfg, error = None, None
    try:
        cfg = load_config(config, overrides)
        # set-up waits follow watchdog.setup_timeout from here on, the agreement below included
        transport.bound = for_rank(transport.rank, WaitBounds(cfg.watchdog.setup_timeout).setup)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return cfg


def run_job(transport: Transport, cfg: Config, inputs: JobInputs, run_dir: str | None, resume: bool) -> Any:
    """Every rank's whole job; returns (the scheduler's engine, the summary) on rank 0, the worker (or
    None) elsewhere.

    A preempted job raises :class:`~mpi_trainer.errors.Preempted` on every rank (exit status 75).
    """
    run = claim_run_dir(transport, cfg, inputs, run_dir, resume)
    watch = preemption()
    try:
        cfg, placements = start_rank(transport, cfg)
        maybe_freeze(cfg.debug, transport.rank, -1)
        watch.install(cfg.checkpoint.preempt_signals, cfg.checkpoint.grace_seconds,
                      lambda: transport.abort(EXIT_PREEMPTED))
        dataset, model, plan, state = setup(transport, cfg, inputs, run)
        plan = transport.bcast_object(plan)
        if plan.finished:  # a complete run, and no more rounds asked for: every rank leaves
            return finished_run(run, model) if transport.rank == 0 else None
        return train_roles(transport, cfg, inputs, (dataset, model, plan, run, state), placements)
    finally:
        watch.uninstall()
        if run is not None:
            run.release()


def train_roles(transport: Transport, cfg: Config, inputs: JobInputs, setup_result: tuple,
                placements: list[Placement]) -> Any:
    """Place the data, start the roles, train; rank 0 returns (engine, summary)."""
    dataset, model, plan, run, state = setup_result
    worker_data, dataset = place_training_data(transport, cfg, dataset, plan)
    role = make_worker(transport, cfg, plan, dataset, worker_data)
    calibrating = time.perf_counter()
    speeds = calibrate_everywhere(transport, cfg, role)
    if transport.rank == 0:
        engine, summary = run_scheduler(transport, cfg, (dataset, model, plan, run, state), placements,
                                        inputs, (speeds, time.perf_counter() - calibrating))
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


# -- this process's device and threads, fixed once ----------------------------------------------
PLACEMENT_KEYS = ("device", "scheduler_device", "threads", "bind_cores")  # the train.* values a placement follows


@dataclass
class ProcessPlacement:
    """Where this process's ranks run, and the ``train.*`` values it was chosen from.

    A backend reads its GPUs and sizes its threads once, when it starts: a process is placed once
    (by :func:`mpi_trainer.init` or its first job), and later jobs in it keep that placement.
    """

    placements: list[Placement]
    settings: dict[str, Any]


_placed: ProcessPlacement | None = None


def start_rank(transport: Transport, cfg: Config) -> tuple[Config, list[Placement]]:
    """Logging, the world's size, abort on an uncaught error, then this process's device and threads
    (chosen the first time; checked against ``cfg`` after that). Returns ``cfg`` and every rank's placement."""
    global _placed
    transport.max_sleep = cfg.comm.poll_interval
    setup_logging(transport.rank, transport.size, transport.host, cfg.log.verbosity)
    check_world(transport)
    check_fault_tolerance(transport, cfg)
    install_abort_on_error(transport)
    transport.learn_hosts()
    if _placed is None:
        _placed = ProcessPlacement(place_process(transport, cfg), placement_settings(cfg))
    else:
        cfg = follow_placement(transport, cfg, _placed.settings)
    return cfg, _placed.placements


def placement_settings(cfg: Config) -> dict[str, Any]:
    return {key: getattr(cfg.train, key) for key in PLACEMENT_KEYS}


def follow_placement(transport: Transport, cfg: Config, settings: dict[str, Any]) -> Config:
    """A job in a process placed already takes that placement's ``train.*`` values; one that asks for
    other values than the defaults is refused on every rank (a started backend cannot move)."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.name in PLACEMENT_KEYS}
    error = None
    for key, chosen in settings.items():
        asked = getattr(cfg.train, key)
        if asked != chosen and asked != defaults[key]:
            error = (f"`train.{key}` differs from the placement this process already has: its backend started "
                     f"with train.{key}={chosen!r} (mpi_trainer.init() or an earlier job) and cannot move. "
                     f"Received: train.{key}={asked!r}; expected {chosen!r}, or the setting left out")
            break
    agree(transport, error)
    return replace(cfg, train=replace(cfg.train, **settings))


def place_process(transport: Transport, cfg: Config) -> list[Placement]:
    """This rank's device and threads, set before its backend starts; every rank's placement."""
    node_cores, node_ranks = transport.node_layout()
    placement, started = place_rank(transport, cfg, node_ranks)  # before anything imports the backend
    threads = threads_for_rank(transport.rank, node_cores, node_ranks, usable_cores(), cfg.train.threads)
    placement = bind_to_cores(placement, cfg, node_cores, node_ranks, threads)
    if started and placement.backend != "torch":  # PyTorch alone resizes its pools at any time
        get_logger().debug("the %s runtime had started: its own threads, not %d", placement.backend, threads)
    else:
        configure_threads(threads)
        placement = replace(placement, threads=threads)
        get_logger().debug("%d threads (%d cores, ranks on this node: %s)", threads, node_cores, node_ranks)
    return confirm_rank(transport, cfg, placement)


def calibrate_everywhere(transport: Transport, cfg: Config, role: Any) -> dict[int, Any]:
    """``data.rebalance``: each worker times a few steps; every rank gets ``{worker rank: speed}``.

    The scheduler cuts round 0's blocks from them (:meth:`Engine.seed_speeds`).
    """
    if not cfg.data.rebalance or uses_lbfgs(cfg):
        return {}
    speeds = transport.allgather(role.calibrate() if transport.rank != 0 else None)
    return {rank: speed for rank, speed in enumerate(speeds) if speed is not None}


def make_worker(transport: Transport, cfg: Config, plan: Any, dataset: Any, worker_data: Any) -> Any:
    """A worker rank's role, dry-run on its first batch; every rank agrees that all of them passed."""
    role, error = None, None
    try:
        if transport.rank != 0:
            role = new_worker(transport, cfg, plan, dataset, worker_data)
    except (InputError, ValueError) as exc:
        error = str(exc)
    agree(transport, error)
    return role


def new_worker(transport: Transport, cfg: Config, plan: Any, dataset: Any, worker_data: Any) -> Any:
    import keras

    from mpi_trainer.comm.protocol import WorkerLink
    from mpi_trainer.persistence.resume import worker_seed

    if uses_lbfgs(cfg):
        from mpi_trainer.worker.lbfgs import LbfgsWorker

        return LbfgsWorker(WorkerLink(transport), plan, cfg, worker_data.fixed_x, worker_data.fixed_y)
    from mpi_trainer.worker import Worker

    keras.utils.set_random_seed(worker_seed(cfg.train.seed, transport.rank, plan.start_round))
    worker = Worker(WorkerLink(transport), plan, dataset, cfg, worker_data)
    worker.preflight()
    return worker


def backend_installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def bind_to_cores(placement: Placement, cfg: Config, node_cores: int, node_ranks: list[int],
                  threads: int) -> Placement:
    """``train.bind_cores``: a CPU worker keeps to its own cores, before its backend starts its threads
    (they inherit it). Not where mpirun bound the rank already, nor where the workers do not fit."""
    allowed = allowed_cores()
    if (not cfg.train.bind_cores or placement.role != "worker" or placement.device != "cpu"
            or allowed is None or len(allowed) < node_cores):
        return placement
    cores = worker_cores(placement.rank, node_ranks, threads, allowed)
    if cores is None:
        return placement
    os.sched_setaffinity(0, cores)
    return replace(placement, cores=cores)


def place_rank(transport: Transport, cfg: Config, node_ranks: list[int]) -> tuple[Placement, bool]:
    """Choose this rank's device and narrow the visible GPUs to it; a rank that cannot fails them all.

    Also says whether the backend had started already (too late to narrow GPUs or size threads):
    on a node with GPUs that fails every rank.
    """
    placement, started, error = None, False, None
    try:
        backend = configured_backend()
        check_backend(backend, backend_installed)
        inventory = discover_gpus()
        placement = choose_placement(transport.rank, transport.host, node_ranks, cfg.train.device,
                                     cfg.train.scheduler_device, inventory, backend)
        started = backend_started(backend)
        if started:
            refuse_started_backend(placement, inventory)
        os.environ.update(backend_environment(placement))
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return placement, started


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
    # oneDNN stays on (TensorFlow's default): LeNet trained at 560-620 samples/s with it against
    # 280 without on this project's 2-core CI machine. Its reordered float arithmetic can make
    # repeated runs differ in the last bits; TF_ENABLE_ONEDNN_OPTS=0 trades that speed for repeatability.


def report_error(exc: BaseException) -> int:
    sys.stderr.write(f"mpi_trainer: error: {exc}\n")
    sys.stderr.flush()
    return EXIT_INPUT_ERROR
