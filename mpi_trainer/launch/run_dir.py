"""Where a run's directory is: the one the script names, ``launch``'s, or a new one under ``runs/``; and the
overrides ``launch --set`` hands the script. What a directory holds is the fit's record
(:class:`~mpi_trainer.trainer.run_record.FitRecord`).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from mpi_trainer.errors import ConfigError

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


def chosen_path(run_dir: str | None, config_path: str | Path | None) -> Path:
    return Path(run_dir or os.environ.get(RUN_DIR_ENV) or default_run_dir(config_path))
