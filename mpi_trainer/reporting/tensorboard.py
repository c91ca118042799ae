"""Per-round scalars as TensorBoard event files (log.tensorboard = true), written by rank 0.

The writer is ``tensorboardX``: pure Python, so it works whatever the Keras
backend (TensorFlow, JAX or PyTorch) and imports no TensorFlow. Every numeric
column of rounds.csv becomes a scalar at step = round; the per-worker columns
(``worker_train_seconds``, ``block_sizes``) become one scalar per worker rank.
View with ``tensorboard --logdir RUN_DIR/tensorboard``.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mpi_trainer.persistence.run_files import TENSORBOARD_DIR
from mpi_trainer.reporting.rundata import split_per_worker

FLUSH_EVERY_SECONDS = 1.0

PER_WORKER = {"worker_train_seconds": "workers/train_seconds", "block_sizes": "workers/block_size"}
SKIPPED = {"round"}  # the step itself


def scalar_tag(column: str) -> str:
    """Tags grouped the way a user looks for them: metrics, time, traffic, the rest."""
    if column.startswith(("test_", "train_loss", "train_accuracy", "val_")):
        return f"metrics/{column}"
    if column.endswith("_seconds") or column == "idle_fraction":
        return f"time/{column}"
    if column == "bytes":
        return "traffic/bytes"
    return f"run/{column}"


def round_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The tags and values of one round; empty and non-numeric cells are left out."""
    scalars = {}
    for column, value in row.items():
        if column in SKIPPED:
            continue
        if column in PER_WORKER:
            for index, share in enumerate(split_per_worker(value)):
                scalars[f"{PER_WORKER[column]}/rank_{index + 1}"] = share
            continue
        number = _number(value)
        if number is not None:
            scalars[scalar_tag(column)] = number
    return scalars


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


class TensorBoardRounds:
    """``write_round(row)`` once per recorded round, ``close()`` at the end.

    The event files are derived from rounds.csv: a job starting on a directory that has them
    writes them afresh from the rows it keeps (``kept_rounds``), so that rounds an interrupted
    attempt logged after its checkpoint, and runs again, appear once.
    """

    def __init__(self, run_dir: Path, kept_rounds: Sequence[Mapping[str, Any]] = ()) -> None:
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.summary_pb2 import Summary

        directory = Path(run_dir) / TENSORBOARD_DIR
        if directory.exists():
            shutil.rmtree(directory)
        self.writer = SummaryWriter(str(directory), flush_secs=5)
        self.summary = Summary
        self.flushed = -math.inf
        for row in kept_rounds:
            self.write_round(row)

    def write_round(self, row: Mapping[str, Any]) -> None:
        # One event holds the round's ~17 scalars: an event per scalar (``add_scalar``) cost rank 0
        # 1.5 ms of CPU a round, time a one-step round's worker shares its cores with.
        values = [self.summary.Value(tag=tag, simple_value=value) for tag, value in round_scalars(row).items()]
        self.writer.file_writer.add_summary(self.summary(value=values), int(row["round"]))
        # on disk within a second, when TensorBoard looks; a flush per round would cost a few ms
        # of every step at train.sync_every = 1
        if time.monotonic() - self.flushed >= FLUSH_EVERY_SECONDS:
            self.writer.flush()
            self.flushed = time.monotonic()

    def close(self) -> None:
        self.writer.close()
