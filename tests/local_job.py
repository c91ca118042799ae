"""A whole job in one process: the scheduler engine and real workers on the naive local transport."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.comm.protocol import JobPlan, Report, SchedulerLink, WorkerLink
from mpi_trainer.config import config_from_dict
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.placement import place_data
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.data.streamed import streamed_train
from mpi_trainer.launch.job_setup import JobInputs, load_dataset_for_rank, plan_job
from mpi_trainer.launch.roles import pick_roles
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.persistence.resume import load_resume_state
from mpi_trainer.persistence.run_files import read_rounds
from mpi_trainer.persistence.run_record import RunContext
from mpi_trainer.worker import Worker
from mpi_trainer.worker.training import LocalTraining


class RecordingTraining(LocalTraining):
    """A real worker's training that keeps what it trained each round, for checking the aggregate by hand."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.trained: list[tuple[Report, np.ndarray]] = []
        self.step_rows_by_round: list[list[np.ndarray]] = []  # train.sync_every > 0: each step's block rows
        self.started_from: list[np.ndarray] = []  # the global weights each round trained from

    def train_and_report(self, round_index: int, start: np.ndarray,
                         max_steps: int | None = None) -> tuple[Report, np.ndarray]:
        self.step_rows_by_round.append([])
        self.started_from.append(start.copy())
        report, local = super().train_and_report(round_index, start, max_steps)
        self.trained.append((report, local.copy()))
        return report, local

    def step_rows(self) -> np.ndarray:
        rows = super().step_rows()
        self.step_rows_by_round[-1].append(rows.copy())
        return rows


class RecordingWorker(Worker):
    """A real worker whose training records each round (:class:`RecordingTraining`)."""

    training_type = RecordingTraining
    training: RecordingTraining

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.scored_rounds: list[int] = []  # evaluation.where = "workers": the rounds it scored a shard of

    @property
    def trained(self) -> list[tuple[Report, np.ndarray]]:
        return self.training.trained

    @property
    def step_rows_by_round(self) -> list[list[np.ndarray]]:
        return self.training.step_rows_by_round

    @property
    def started_from(self) -> list[np.ndarray]:
        return self.training.started_from

    def evaluate(self, order: Any) -> None:
        super().evaluate(order)
        self.scored_rounds.append(order.round)


@dataclass
class LocalJob:
    run_dir: Path
    engine: Any
    workers: list[RecordingWorker]
    summary: dict[str, Any] = field(default_factory=dict)

    def rounds(self) -> list[dict[str, str]]:
        return read_rounds(self.run_dir / "rounds.csv")

    def trained(self, round_index: int) -> list[tuple[Report, np.ndarray]]:
        """Every worker's report and weights of ``round_index`` (first update per worker under SSP)."""
        return [next(t for t in w.trained if t[0].round == round_index) for w in self.workers]


def place(world: LocalWorld, cfg: Any, dataset: Any, plan: JobPlan) -> dict[int, tuple[Any, Any]]:
    """Each rank's training rows as set-up places them (shared file, or scattered by the scheduler)."""
    transports = world.transports()
    roles = {0: lambda: place_data(SchedulerLink(transports[0]), 0, cfg, dataset, plan)}
    for rank in range(1, world.size):
        mine = None if cfg.data.scatters else dataset
        roles[rank] = lambda rank=rank, mine=mine: place_data(WorkerLink(transports[rank]), rank, cfg, mine, plan)
    return world.run(roles)


def build_local_job(run_dir: Path, workers: int = 2, builder: Any = None, resume: bool = False,
                    inputs: JobInputs | None = None, callbacks: Any = None, preemption: Preemption | None = None,
                    **sections: Any) -> tuple[Any, list, Any]:
    """The scheduler's engine, the workers (dry-run, not calibrated) and their local world, not yet running.

    Trains on the built-in digits (by default), on ``inputs.pipeline`` (every rank shares the one
    adapter here) or on ``inputs.arrays`` (with ``data={"source": "arrays"}``); set-up is the job's own
    (:func:`plan_job`: build, dry run, metric names); ``builder`` is a model function or model as
    :func:`mpi_trainer.fit` takes it.
    ``resume``: the engine carries on from ``run_dir``'s checkpoint (the workers get its weights).
    ``preemption``: the job's preemption state, shared by every rank here (one process); a test
    requests the stop on it as a signal handler would.
    Rounds are plain averages unless ``aggregation`` names an outer optimizer (``"auto"`` included), so
    that a test can check the global model against the workers' weights by hand.
    """
    table = {"data": {"source": "pipeline" if inputs else "digits"}, "train": {"epochs": 2, "batch_size": 64},
             "aggregation": {"outer_optimizer": "none"}, "log": {"verbosity": 0}}
    for name, values in sections.items():
        table[name] = {**table.get(name, {}), **values}
    cfg = config_from_dict(table)
    if cfg.data.stream_auto:  # as a job resolves it before set-up (launch.job_setup.resolve_stream)
        from mpi_trainer.data.memory import decide
        from mpi_trainer.launch.job_setup import with_stream

        cfg = with_stream(cfg, cfg.data.is_file and decide(cfg.data.source, workers, workers + 1).stream)
    inputs = inputs or JobInputs()
    inputs.builder = builder
    streamed = inputs.pipeline or cfg.data.stream or cfg.data.is_image_folder or cfg.data.is_tfrecord
    dataset = load_dataset_for_rank(0, cfg, None, workers, inputs) if streamed else load_dataset(
        cfg.data, cfg.train.seed, arrays=inputs.arrays)
    streamed_rows = streamed_train(dataset)  # an adapter cuts its own blocks, as in launch.job_setup.setup
    bounds = (streamed_rows.block_bounds(workers) if streamed_rows is not None
              else block_bounds(dataset.num_train, workers))
    state = load_resume_state(run_dir, cfg.to_dict()) if resume and run_dir.exists() else None
    # planned from the checkpoint's next round, as a job's set-up plans it: a resumed worker seeds its
    # shuffles from that round (persistence.resume.worker_seed), as under mpirun; a refused plan writes nothing
    model, plan = plan_job(cfg, dataset, inputs, bounds, state)
    world = LocalWorld(workers + 1)
    transports = world.transports()
    placed = place(world, cfg, dataset, plan)
    run_dir.mkdir(parents=True, exist_ok=True)
    preemption = preemption or Preemption()
    context = RunContext(callbacks=None if callbacks is None else tuple(callbacks),  # Keras callbacks on rank 0
                         preemption=preemption)
    engine = pick_roles(cfg).engine(SchedulerLink(transports[0]), cfg, dataset, model, plan, run_dir, resume=state,
                                    context=context)
    # Built one after another (not in their threads) so that every run seeds its layers alike.
    team = [RecordingWorker(WorkerLink(transports[rank]), plan, placed[rank][1], cfg, placed[rank][0], preemption)
            for rank in range(1, workers + 1)]
    for worker in team:
        worker.preflight()
    return engine, team, world


def run_local_job(run_dir: Path, workers: int = 2, builder: Any = None, callbacks: Any = (),
                  resume: bool = False, inputs: JobInputs | None = None, preemption: Preemption | None = None,
                  **sections: Any) -> LocalJob:
    """Train with ``workers`` worker threads (see :func:`build_local_job`); returns the finished job."""
    engine, team, world = build_local_job(run_dir, workers, builder, resume, inputs, callbacks or None, preemption,
                                          **sections)
    # data.rebalance: round 0's blocks are cut from each worker's timed steps, as run_job does
    engine.seed_speeds({worker.rank: speed for worker in team if (speed := worker.calibrate()) is not None})
    results = world.run({0: engine.run, **{w.rank: w.run for w in team}})
    return LocalJob(run_dir, engine, team, results[0])
