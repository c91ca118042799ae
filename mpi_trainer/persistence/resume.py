"""Picking a run up again from its checkpoint (``train --resume``).

The checkpoint holds everything the scheduler needs to carry on: the global and
best weights, the outer optimizer's state, the round reached, early-stopping counters, optimizer steps so
far, the learning-rate scale left by NaN rollbacks, cumulative wall time and
traffic, the config the run was made with and the run's fingerprint (see
:mod:`~mpi_trainer.persistence.run_state`). Reading it changes nothing; only once
every check has passed is ``rounds.csv`` cut back to the checkpoint's round
(:func:`keep_rounds_through`), so rounds run again after a crash are logged once.
The block plan is not restored but re-planned for the current worker count,
which is what makes a restart with fewer (or more) workers work.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.outer_optimizer import STATE_PREFIX as OUTER_PREFIX
from mpi_trainer.errors import ConfigError
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.checkpoint import StoredArray, open_checkpoint
from mpi_trainer.persistence.optimizer_state import ARRAY_PREFIX, split_arrays
from mpi_trainer.persistence.run_files import CHECKPOINT_NAME, ROUNDS_NAME, UPDATES_NAME, backup_path, write_atomic
from mpi_trainer.persistence.run_state import fingerprint_differences

# A resumed worker seeds with train.seed + rank + RESUME_SEED_STRIDE * first round, so it
# does not replay the shuffles of the run's first rounds.
RESUME_SEED_STRIDE = 7919
# Keys whose change makes the saved weights or the data split meaningless.
COMPATIBILITY_KEYS = ("data.source", "data.test_size", "data.validation_size", "model.name", "model.optimizer",
                      "model.loss", "train.seed", "aggregation.ssp")


@dataclass
class ResumeState:
    """The scheduler's state at the checkpoint a run resumes from."""

    next_round: int
    weights: np.ndarray
    best_weights: np.ndarray | StoredArray | None  # left on disk in the checkpoint until the recorder spills it
    best_value: float | None
    best_round: int
    wait: int
    steps: int
    lr_scale: float
    wall_seconds: float
    traffic_bytes: int
    previous_workers: int
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    # each worker's, left on disk in the checkpoint: read part by part as it is sent back to a worker
    optimizer_states: dict[int, np.ndarray | StoredArray] = field(default_factory=dict)
    # the scheduler's outer optimizer state, as checkpoint arrays (``outer_*``)
    outer_state: dict[str, np.ndarray] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)  # empty for checkpoints made before it existed


def worker_seed(seed: int, rank: int, start_round: int) -> int:
    return seed + rank + RESUME_SEED_STRIDE * start_round


def flatten_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def incompatible_keys(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The compatibility keys whose values differ between two config dicts."""
    old, new = flatten_keys(saved), flatten_keys(current)
    return [key for key in COMPATIBILITY_KEYS if old.get(key) != new.get(key)]


def check_compatible(saved: dict[str, Any], current: dict[str, Any]) -> None:
    differing = incompatible_keys(saved, current)
    if differing:
        old, new = flatten_keys(saved), flatten_keys(current)
        details = ", ".join(f"{key}={new.get(key)!r} (checkpoint: {old.get(key)!r})" for key in differing)
        raise ConfigError(f"Cannot resume: the config differs from the checkpoint's in {differing}. "
                          f"Received: {details}; expected the values the run was started with")


def _parse_cell(text: str) -> Any:
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if number.is_integer() and "." not in text and "e" not in text else number


def _complete(row: dict[str, Any]) -> bool:
    """False for a row torn by a crash mid-write (missing cells, or a cut-off round number)."""
    if None in row or any(value is None for value in row.values()):
        return False
    return str(row.get("round", "")).isdigit()


def trim_rounds(path: Path, last_round: int) -> list[dict[str, Any]]:
    """Keep the rows of rounds ``<= last_round`` in ``path`` (rewritten atomically); return them parsed."""
    if not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fieldnames = list(reader.fieldnames or [])
        rows = [row for row in reader if _complete(row) and int(row["round"]) <= last_round]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, out.getvalue())
    return parse_rows(rows)


def parse_rows(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """CSV rows with their numbers as numbers."""
    return [{key: _parse_cell(value) for key, value in row.items()} for row in rows]


def discard_rounds(run_dir: Path) -> None:
    """A run without a checkpoint starts over: its partial logs go."""
    logs = [run_dir / name for name in (ROUNDS_NAME, UPDATES_NAME) if (run_dir / name).exists()]
    if logs:
        get_logger().warning("no checkpoint to resume from; starting the run over")
    for path in logs:
        path.unlink()


def keep_rounds_through(run_dir: Path, state: ResumeState | None) -> None:
    """Once every check has passed: ``rounds.csv`` cut back to the checkpoint's round (``state.rounds``
    gets the rows kept), or the partial logs discarded when there is no checkpoint."""
    if state is None:
        discard_rounds(run_dir)
        return
    state.rounds = trim_rounds(run_dir / ROUNDS_NAME, state.next_round - 1)


def _optional_float(value: Any) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def check_weight_count(state: ResumeState, weight_count: int, model_name: str) -> None:
    if state.weights.size != weight_count:
        raise ConfigError(f"Cannot resume: the checkpoint holds {state.weights.size} weights, the model "
                          f"built from model.name={model_name!r} has {weight_count}")


def check_fingerprint(state: ResumeState, current: dict[str, Any]) -> None:
    """Refuse a resume whose model or data differ from the checkpoint's, naming what differs."""
    differences = fingerprint_differences(state.fingerprint, current)
    if differences:
        raise ConfigError(f"Cannot resume: the model or data differ from the checkpoint's. Received: "
                          f"{'; '.join(differences)}; expected the model and data the run was started with "
                          f"(or a new run directory)")


def load_resume_state(run_dir: Path, config: dict[str, Any]) -> ResumeState | None:
    """:func:`read_resume_state`, then :func:`keep_rounds_through` (for callers with nothing else to check)."""
    state = read_resume_state(run_dir, config)
    keep_rounds_through(run_dir, state)
    return state


def left_on_disk(name: str) -> bool:
    """The checkpoint arrays a resume or a rollback does not read into memory when it opens the file: the
    workers' optimizer states and the best weights (each as large as the model or larger)."""
    return name.startswith(ARRAY_PREFIX) or name == "best_weights"


def read_resume_state(run_dir: Path, config: dict[str, Any]) -> ResumeState | None:
    """Read the run's checkpoint and check it fits ``config``; None if none exists. Writes nothing."""
    checkpoint = run_dir / CHECKPOINT_NAME
    if not checkpoint.exists() and not backup_path(checkpoint).exists():
        return None
    arrays, stored, meta = open_checkpoint(checkpoint, left_on_disk)
    check_compatible(meta["config"], config)
    last_round = int(meta["round"])
    return ResumeState(
        next_round=last_round + 1, weights=np.asarray(arrays["weights"], dtype=np.float32),
        best_weights=stored.get("best_weights", arrays.get("best_weights")),
        best_value=_optional_float(meta.get("best_value")), best_round=int(meta.get("best_round", -1)),
        wait=int(meta.get("wait", 0)),
        steps=int(meta.get("steps", 0)), lr_scale=float(meta.get("lr_scale", 1.0)),
        wall_seconds=float(meta.get("wall_seconds", 0.0)), traffic_bytes=int(meta.get("traffic_bytes", 0)),
        previous_workers=len(meta.get("block_bounds", [])), rollbacks=list(meta.get("rollbacks", [])),
        optimizer_states={**split_arrays(arrays), **split_arrays(stored)},
        fingerprint=dict(meta.get("fingerprint", {})),
        outer_state={name: array for name, array in arrays.items() if name.startswith(OUTER_PREFIX)})
