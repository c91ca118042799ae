"""Every rank's set-up before training: the data it reads, and on rank 0 the model and the job's plan.

Nothing in the run directory is written before every rank has passed its checks (see :mod:`.run_dir`);
each check's failure is agreed on by every rank (:mod:`.agreement`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.algorithms.early_stopping import watched_metric
from mpi_trainer.comm.transport import Transport
from mpi_trainer.config import Config
from mpi_trainer.data.readers import RawArrays
from mpi_trainer.errors import InputError
from mpi_trainer.launch.agreement import agree, agree_on_failure
from mpi_trainer.launch.run_dir import RunDirectory, begin_writing, check_against_run, open_run_dir
from mpi_trainer.logs import get_logger

if TYPE_CHECKING:
    from mpi_trainer.comm.messages import JobPlan
    from mpi_trainer.data.memory import StreamDecision
    from mpi_trainer.data.placement import WorkerData
    from mpi_trainer.data.sources import Dataset
    from mpi_trainer.persistence.resume import ResumeState


@dataclass
class JobInputs:
    """What a Python caller hands the job besides the config (see :func:`mpi_trainer.fit`)."""

    arrays: RawArrays | None = None  # the data as arrays, instead of data.source
    builder: Any = None  # a model function or a built model, instead of model.name
    callbacks: Sequence[Any] = ()  # Keras callbacks, run on rank 0 once per round
    config_path: str | Path | None = None  # names the default run directory
    pipeline: Any = None  # an input adapter (tf.data, PyDataset, generator...), instead of arrays
    validation: Any = None  # the pipeline's validation_data, read by the ranks that score
    class_weight: dict[int, float] | None = None  # fit's class_weight, for the workers' training loss
    initial_epoch: int = 0  # fit's initial_epoch: the callbacks' epoch of round 0
    why: str | None = None  # why the round engines train this job rather than the Keras fit (logged)


@dataclass
class JobSetup:
    """What :func:`setup` leaves each rank. ``model`` and ``run`` are rank 0's (None elsewhere); ``plan`` is
    rank 0's until it is broadcast; ``dataset`` is None on a worker whose rows are scattered to it."""

    dataset: Dataset | None
    model: Any  # a keras.Model
    plan: JobPlan | None
    run: RunDirectory | None
    state: ResumeState | None  # of the run resumed

    @property
    def job_plan(self) -> JobPlan:
        """The job's plan, which every rank holds once rank 0 has broadcast it."""
        if self.plan is None:
            raise RuntimeError("the job's plan is read before rank 0 broadcast it")
        return self.plan

    @property
    def placed_dataset(self) -> Dataset:
        """The dataset this rank goes on with, which every rank holds once the data is placed (a worker under
        scatter reads none at set-up)."""
        return read_dataset(self.dataset)

    @property
    def run_directory(self) -> RunDirectory:
        """Rank 0's run directory (no other rank holds one)."""
        return scheduler_run(self.run)


def read_dataset(dataset: Dataset | None) -> Dataset:
    """The dataset a rank read (every rank but a worker under scatter reads one at set-up)."""
    if dataset is None:
        raise RuntimeError("this rank read no dataset")
    return dataset


def scheduler_run(run: RunDirectory | None) -> RunDirectory:
    """The run directory :func:`claim_run_dir` gave rank 0 (no other rank holds one)."""
    if run is None:
        raise RuntimeError("only rank 0 holds the run directory")
    return run


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


def setup(transport: Transport, cfg: Config, inputs: JobInputs, run: RunDirectory | None) -> JobSetup:
    """Load data everywhere; on rank 0 build the model and check it against the run directory's run."""
    from mpi_trainer.models.gradients import gradient_backend

    dataset: Dataset | None = None
    model: Any = None
    plan: JobPlan | None = None
    error, bug = None, None
    try:
        hooks.active().check_slow_ranks(transport.size)
        if cfg.model.uses_lbfgs:
            gradient_backend()  # every rank: each computes with its own backend
        dataset = load_dataset_for_rank(transport.rank, cfg, inputs.arrays, transport.workers, inputs)
        if dataset is not None:  # every reader fails alike
            bounds = dataset.train.block_bounds(transport.workers)
    except (InputError, ValueError, OSError) as exc:  # a reader's complaint about the data
        error = str(exc)
    if transport.rank == 0 and error is None:
        try:
            scheduler, read = scheduler_run(run), read_dataset(dataset)
            model, plan = plan_job(cfg, read, inputs, bounds, scheduler.state)
            check_against_run(scheduler, cfg, read, model)
            plan.finished = scheduler.finished
        except (InputError, OSError) as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug in the user's model: agreed on, then raised here
            bug = exc
    # Bad input fails every rank with one line; a bug fails every rank too, and this one with its traceback.
    if bug is not None:
        agree_on_failure(transport, bug)
    else:
        agree(transport, error)
    if run is not None:
        begin_writing(run)
    return JobSetup(dataset, model, plan, run, None if run is None else run.state)


def plan_job(cfg: Config, dataset: Dataset, inputs: JobInputs, bounds: list[tuple[int, int]],
             state: ResumeState | None) -> tuple[Any, JobPlan]:
    """Rank 0: build the model, dry-run it on the first training rows, and plan the job."""
    import keras

    from mpi_trainer.comm.protocol import JobPlan
    from mpi_trainer.models import build_model
    from mpi_trainer.models.dry_run import SAMPLES, dry_run
    from mpi_trainer.models.gradients import BlockGradient

    keras.utils.set_random_seed(cfg.train.seed)
    model, spec = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes, inputs.builder)
    if cfg.model.uses_lbfgs:
        BlockGradient(model)  # a loss it cannot differentiate fails here, on every rank
    # rank 0 never trains: evaluating the rows meets the loss with the output and the labels without
    # building the optimizer's state (the workers' dry runs train a step)
    metric_names = dry_run(model, *dataset.train.read(np.arange(min(SAMPLES, dataset.num_train))), train=False)
    check_monitor(cfg, metric_names, len(dataset.y_test) > 0)
    # Blocks are always planned for the workers present now: a resume may have fewer or more.
    plan = JobPlan(cfg.to_dict(), spec, bounds, cfg.train.seed, dataset.num_train,
                   state.next_round if state else 0, metric_names, class_weight=inputs.class_weight)
    return model, plan


def check_monitor(cfg: Config, metric_names: list[str], has_test: bool = True) -> None:
    """``early_stopping.monitor`` must name a metric the compiled model reports, on a split that exists."""
    watched_metric(cfg.early_stopping.monitor, cfg.early_stopping.patience, metric_names, has_test)


def load_dataset_for_rank(rank: int, cfg: Config, arrays: RawArrays | None = None, workers: int = 1,
                          inputs: JobInputs | None = None) -> Dataset | None:
    """The scheduler reads validation and test features; a worker only what it scores on.

    Under ``data.placement = "scatter"`` a worker reads nothing (its node may
    not see the file): its rows arrive from the scheduler after set-up.
    A pipeline (``inputs.pipeline``) or a streamed file keeps its training part where it is.
    """
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.sources import TrainRows, load_dataset

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
    if scatter and isinstance(dataset.train, TrainRows):  # always: a streamed input refuses scatter
        dataset.train.check_all()  # bad rows must fail here, not half-way through sending blocks
    return dataset


def streamed_dataset(rank: int, cfg: Config, workers: int, inputs: JobInputs | None) -> Dataset | None:
    """The dataset of a pipeline input, or None; what the config asks of it is checked first."""
    from mpi_trainer.data.streamed import check_allows, pipeline_dataset, streamed_train

    adapter, validation, name = (None, None, "") if inputs is None else (inputs.pipeline, inputs.validation, "")
    if cfg.data.is_image_folder or cfg.data.is_tfrecord:
        from mpi_trainer.data.adapters.records import image_folder, tfrecords

        adapter, validation = (image_folder if cfg.data.is_image_folder else tfrecords)(cfg)
        name = Path(cfg.data.source).name
    if cfg.data.stream is True:  # "auto" is resolved before set-up (resolve_stream); unresolved, it reads whole
        from mpi_trainer.data.adapters.files import stream_dataset

        dataset = stream_dataset(cfg.data)
        streamed = streamed_train(dataset)
        if streamed is not None:  # always: a file read in batches
            check_allows(cfg, streamed.adapter)
        return dataset
    if adapter is None:
        return None
    check_allows(cfg, adapter)
    scores = rank == 0 or cfg.aggregation.elects or cfg.evaluation.on_workers
    return pipeline_dataset(name or adapter.kind, adapter, validation, cfg, workers, read_val=scores,
                            read_test=rank == 0 or cfg.evaluation.on_workers,
                            keras_validation=inputs is not None and inputs.pipeline is adapter)


def place_training_data(transport: Transport, cfg: Config, dataset: Dataset | None,
                        plan: JobPlan) -> tuple[WorkerData | None, Dataset | None]:
    """Workers get their training rows (shared file or scatter); any failure fails every rank.

    Returns (the worker's data or None on rank 0, the dataset this rank goes on with).
    The scheduler's own scatter errors are not caught: a failure half-way through
    sending would leave workers waiting for blocks, so it takes the abort path.
    """
    from mpi_trainer.comm.protocol import SchedulerLink, WorkerLink
    from mpi_trainer.data.placement import place_data

    link = SchedulerLink(transport) if transport.rank == 0 else WorkerLink(transport)
    sender = transport.rank == 0 and cfg.data.scatters
    placed: tuple[WorkerData | None, Dataset | None] = (None, dataset)
    error = None
    try:
        placed = place_data(link, transport.rank, cfg, dataset, plan)
    except (InputError, ValueError) as exc:
        if sender:
            raise RuntimeError(f"scatter failed on the scheduler: {exc}") from exc
        error = str(exc)
    transport.barrier()  # a polling wait while workers read their blocks, then a quick agreement
    agree(transport, error)
    return placed


def log_plan(plan: JobPlan, dataset: Dataset) -> None:
    log = get_logger()
    log.info("dataset %s", dataset.describe())
    if dataset.class_names:
        log.info("%s: string labels mapped to classes: %s", dataset.name, dataset.label_mapping())
    unit = dataset.train.unit
    for index, (start, end) in enumerate(plan.block_bounds):
        log.info("worker rank %d: block start %d end %d size %d%s", index + 1, start, end, end - start,
                 "" if unit == "samples" else f" {unit}")


def resolve_stream(transport: Transport, cfg: Config) -> Config:
    """``data.stream = "auto"`` decided (:mod:`mpi_trainer.data.memory`): every rank estimates whether a
    worker's block fits its memory, and the job streams when any rank's would not. Logged on rank 0."""
    if not cfg.data.stream_auto:
        return cfg
    from mpi_trainer.data.memory import StreamDecision, decide

    _, node_ranks = transport.node_layout()
    decision = decide(cfg.data.source, transport.workers, len(node_ranks)) if cfg.data.is_file \
        else StreamDecision(False, None, 0)
    tight = [rank for rank, streams in enumerate(transport.allgather(decision.stream)) if streams]
    error = None
    if tight:
        error = _stream_refusal(cfg, decision)
    agree(transport, error)
    if transport.rank == 0 and cfg.data.is_file:
        get_logger().info("%s%s", decision.describe(),
                          f"; ranks {tight} would not fit their blocks" if tight and not decision.stream else "")
    return with_stream(cfg, bool(tight))


def with_stream(cfg: Config, stream: bool) -> Config:
    from dataclasses import replace

    return replace(cfg, data=replace(cfg.data, stream=stream))


def _stream_refusal(cfg: Config, decision: StreamDecision) -> str | None:
    """The block does not fit in memory, and the config asks what streaming cannot give: say both."""
    from mpi_trainer.data.adapters.files import stream_dataset
    from mpi_trainer.data.streamed import refusals, streamed_train

    streamed = streamed_train(stream_dataset(cfg.data))
    refused = refusals(with_stream(cfg, True), streamed.adapter) if streamed is not None else []
    if not refused:
        return None
    return (f"A worker's block of {cfg.data.source!r} would not fit in memory, so data.stream = \"auto\" streams "
            f"it from disk, but: {refused[0]}. {decision.describe()}")

