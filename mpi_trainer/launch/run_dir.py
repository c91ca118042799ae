"""Rank 0's run directory: its name, its lock, and what an earlier job left in it.

The order is what keeps a directory consistent: take the lock (a second job
fails here), read what the directory holds (checkpoint, summary), check the new
job against it (config keys, weight count, fingerprint), and only then write:
leftovers of interrupted writes go, the round logs are cut back to the
checkpoint, and the log file opens. A job refused at any check has changed
nothing but the lock file's note.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer.config import Config
from mpi_trainer.errors import ConfigError
from mpi_trainer.logs import add_log_file, get_logger
from mpi_trainer.persistence.resume import (
    ResumeState,
    check_fingerprint,
    check_weight_count,
    keep_rounds_through,
    parse_rows,
    read_resume_state,
)
from mpi_trainer.persistence.run_files import (
    FINAL_WEIGHTS_NAME,
    FIT_PRINT_NAME,
    LOG_NAME,
    ROUNDS_NAME,
    read_rounds,
    verify_digest,
)
from mpi_trainer.persistence.run_lock import RunLock, launcher_holder
from mpi_trainer.persistence.run_state import (
    fingerprint,
    is_complete,
    more_to_train,
    read_summary,
    remove_leftovers,
)

if TYPE_CHECKING:
    from mpi_trainer.data.sources import Dataset


RUN_DIR_ENV = "MPI_TRAINER_RUN_DIR"  # the launcher's run directory, the default of a supervised fit()
SET_ENV = "MPI_TRAINER_SET"  # `launch --set KEY=VALUE -- COMMAND`: the overrides, a JSON list, for the script's fit()


def launch_overrides() -> list[str]:
    """The ``--set KEY=VALUE`` texts of the launcher that started this script (none outside ``launch``)."""
    text = os.environ.get(SET_ENV)
    if not text:
        return []
    pairs = json.loads(text)
    if not isinstance(pairs, list) or not all(isinstance(pair, str) for pair in pairs):
        raise ConfigError(f"{SET_ENV} must hold a JSON list of 'key=value' strings (what `launch --set` "
                          f"writes). Received: {SET_ENV}={text!r}")
    return pairs


def default_run_dir(config_path: str | Path | None) -> Path:
    """``runs/<config>-slurm<job id>`` under Slurm (a requeued job finds its run again), else
    ``runs/<config>-<time>-<pid>-<random>``: two jobs started in the same second get two directories."""
    stem = Path(config_path).stem if config_path else "run"
    if os.environ.get("SLURM_JOB_ID"):
        return Path("runs") / f"{stem}-slurm{os.environ['SLURM_JOB_ID']}"
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class RunDirectory:
    """Rank 0's view of its run directory once locked: what it holds and what the job will do with it."""

    path: Path
    lock: RunLock
    state: ResumeState | None = None  # the checkpoint to resume from; None: start at round 0
    summary: dict[str, Any] | None = None  # the earlier job's summary.json
    finished: bool = False  # complete, and this job asks for no more rounds
    fingerprint: dict[str, Any] = field(default_factory=dict)  # this job's, once checked
    written: bool = False  # every check passed and the job began writing

    def release(self) -> None:
        """Unlock; a job refused before it wrote anything leaves no directory it created behind."""
        self.lock.release(unused=not self.written)


def chosen_path(run_dir: str | None, config_path: str | Path | None) -> Path:
    return Path(run_dir or os.environ.get(RUN_DIR_ENV) or default_run_dir(config_path))


def open_run_dir(run_dir: str | None, config_path: str | Path | None, cfg: Config, resume: bool) -> RunDirectory:
    """Rank 0: lock the directory and read what it holds; writes nothing else."""
    if resume and not (run_dir or os.environ.get(RUN_DIR_ENV)):
        raise ConfigError("`--resume` needs the run directory to continue. Received: no --run-dir; "
                          "expected --run-dir DIR of an earlier run")
    path = chosen_path(run_dir, config_path)
    lock = RunLock(path).acquire(launcher_holder())
    if (path / FIT_PRINT_NAME).exists():
        lock.release()
        raise ConfigError(f"The run directory {str(path)!r} holds the run of a keras.Model fit (it has "
                          f"{FIT_PRINT_NAME}), which the engines cannot resume. Received: --run-dir {str(path)!r}; "
                          f"expected a new directory, or the config and script that run was started with")
    try:
        summary = read_summary(path)
        state = read_resume_state(path, cfg.to_dict())
    except BaseException:
        lock.release(unused=True)
        raise
    finished = is_complete(summary) and not more_to_train(summary, cfg.train.epochs, cfg.train.max_steps)
    return RunDirectory(path, lock, state, summary, finished)


def check_against_run(run: RunDirectory, cfg: Config, dataset: Dataset, model: Any) -> None:
    """The new job's model and data against the checkpoint's (refused naming what differs)."""
    run.fingerprint = fingerprint(cfg.data.source, dataset, model)
    if run.state is not None:
        check_weight_count(run.state, sum(math.prod(v.shape) for v in model.weights), cfg.model.name)
        check_fingerprint(run.state, run.fingerprint)


def begin_writing(run: RunDirectory) -> None:
    """Every check passed: clear interrupted writes, cut the round logs back, open the log file."""
    run.written = True
    remove_leftovers(run.path)
    if not run.finished:
        keep_rounds_through(run.path, run.state)
    add_log_file(run.path / LOG_NAME)
    if run.finished:
        summary = run.summary or {}
        get_logger().info("the run in %s is complete (stop_reason %s after %s rounds); nothing to train. Ask "
                          "for more rounds (train.epochs) to go on, or choose another run directory", run.path,
                          summary.get("stop_reason"), summary.get("rounds_completed"))
    elif run.state is not None:
        get_logger().info("%s holds an unfinished run: resuming from its checkpoint of round %d", run.path,
                          run.state.next_round - 1)


@dataclass
class FinishedRun:
    """A complete run's results, read back (what :func:`mpi_trainer.fit` returns when nothing was trained)."""

    rounds: list[dict[str, Any]]
    model: Any
    run_dir: Path


def finished_run(run: RunDirectory, model: Any) -> tuple[FinishedRun, dict[str, Any]]:
    """The results of the complete run in ``run``: its rounds, its final weights in ``model``, its summary."""
    weights = run.path / FINAL_WEIGHTS_NAME
    if weights.exists():
        try:
            verify_digest(weights)
        except ValueError as exc:
            raise ConfigError(f"The complete run's final weights are damaged: {exc}. Received: "
                              f"run_dir={str(run.path)!r}; expected the weights the run wrote (restore "
                              f"{FINAL_WEIGHTS_NAME}, or remove summary.json to train again from the "
                              f"checkpoint)") from None
        model.load_weights(weights)
    rows = parse_rows(read_rounds(run.path / ROUNDS_NAME)) if (run.path / ROUNDS_NAME).exists() else []
    print(f"run directory: {run.path} (complete; nothing trained)", flush=True)
    return FinishedRun(rows, model, run.path), dict(run.summary or {})
