"""Rank 0's progress over rounds, and the workers' per-batch progress at verbosity 2.

On a terminal, rank 0 draws a Keras :class:`~keras.utils.Progbar` over the
rounds (with ETA); elsewhere (CI, a log file) it writes one plain line per
round, so a log stays readable. Either way the round line also goes to
``train.log``. ``log.verbosity``: 0 shows the round progress and warnings,
1 adds rank 0's other messages and one line per worker per round, 2 adds the
workers' own messages and their per-batch progress, tagged with their rank.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from mpi_trainer.logs import console_state, get_logger
from mpi_trainer.reporting.table import format_round_line

BATCH_LINES_PER_ROUND = 10  # per-batch progress lines a worker logs per round at most


def split_per_worker(cell: Any) -> list[float]:
    """A "v1;v2;..." cell of rounds.csv (one value per worker rank, from rank 1) as numbers."""
    text = str(cell if cell is not None else "").strip()
    return [float(value) for value in text.split(";")] if text else []


def worker_lines(row: Mapping[str, Any]) -> list[str]:
    """One line per worker: its samples and train seconds this round (where the row has them)."""
    sizes = split_per_worker(row.get("block_sizes"))
    times = split_per_worker(row.get("worker_train_seconds"))
    lines = []
    for index in range(max(len(sizes), len(times))):
        parts = [f"worker rank {index + 1}:"]
        if index < len(sizes):
            parts.append(f"{int(sizes[index])} samples")
        if index < len(times):
            parts.append(f"train {times[index]:.2f} s")
        lines.append(" ".join(parts))
    return lines


class RoundProgress:
    """Shown by rank 0 once per recorded round: ``update(row)``, then ``close()`` at the end."""

    def __init__(self, epochs: int, start_round: int = 0, stream: TextIO | None = None) -> None:
        self.epochs = epochs
        self.start_round = start_round
        self.stream = stream or sys.stdout
        self.log = get_logger()
        self.started = time.perf_counter()
        self.bar = self._make_bar() if _is_terminal(self.stream) else None
        self.shown = 0

    def _make_bar(self) -> Any:
        from keras.utils import Progbar

        console_state().bar_active = True
        # After a resume the bar counts this attempt's rounds, so that its ETA uses their pace.
        return Progbar(self.epochs - self.start_round, unit_name="round", interval=0,
                       stateful_metrics=["acc", "loss", "MB"])

    def update(self, row: Mapping[str, Any]) -> None:
        line = format_round_line(row, self.epochs)
        self.log.info("%s  eta %s", line, self.eta(row), extra={"verbosity": 0, "in_bar": True})
        for text in worker_lines(row):
            self.log.info("  %s", text, extra={"verbosity": 1})
        self.shown = int(row["round"]) + 1 - self.start_round
        if self.bar is not None:
            values = [("acc", float(row["test_accuracy"])), ("loss", float(row["test_loss"])),
                      ("MB", float(row["bytes"]) / 1e6)]
            # a round that evaluation.every leaves unscored would turn the bar's averages into NaN
            self.bar.update(self.shown, values=[(name, v) for name, v in values if not math.isnan(v)])

    def eta(self, row: Mapping[str, Any]) -> str:
        """Seconds left at this attempt's mean pace per round."""
        done = int(row["round"]) + 1 - self.start_round
        left = self.epochs - int(row["round"]) - 1
        if done <= 0 or left <= 0:
            return "0 s"
        return f"{left * (time.perf_counter() - self.started) / done:.0f} s"

    def close(self) -> None:
        """Ends the bar's line when the run stopped before the last round (early stopping)."""
        if self.bar is not None and self.shown < self.epochs - self.start_round:
            self.stream.write("\n")
            self.stream.flush()
        console_state().bar_active = False


def _is_terminal(stream: TextIO) -> bool:
    """Whether the user sees this stream on a terminal (not a file, a pipe or CI's log).

    Open MPI hands its ranks a pseudo-terminal even when ``mpirun``'s own output goes to a
    file or a pipe, so under a launcher on this node its stdout decides; under a remote
    launch daemon the user's terminal cannot be seen, and plain lines are the safe choice.
    """
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return False
    launcher = _launcher_ancestor(os.getppid())
    if launcher is None:
        return True
    name, pid = launcher
    return name in LAUNCHERS and _stdout_is_terminal(pid)


LAUNCHERS = ("mpirun", "mpiexec", "prterun", "orterun")
LAUNCH_DAEMONS = ("prted", "orted")


def _launcher_ancestor(pid: int, depth: int = 8) -> tuple[str, int] | None:
    """The nearest mpirun-like ancestor (or launch daemon) and its pid, from /proc."""
    for _ in range(depth):
        if pid <= 1:
            return None
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if name in LAUNCHERS + LAUNCH_DAEMONS:
                return name, pid
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
    return None


def _stdout_is_terminal(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/1").startswith(("/dev/pts/", "/dev/tty"))
    except OSError:
        return False


def with_batch_progress(callbacks: list[Any] | None, verbosity: int, steps: int) -> list[Any] | None:
    """A worker's fit callbacks, plus per-batch progress lines at verbosity 2."""
    if verbosity < 2 or steps <= 0:
        return callbacks
    return [*(callbacks or []), batch_progress(steps)]


def batch_progress(steps: int) -> Any:
    """A Keras callback: about ten progress lines per local epoch, rank-tagged by the log format."""
    import keras

    every = max(1, math.ceil(steps / BATCH_LINES_PER_ROUND))
    log = get_logger()

    class BatchProgress(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if (batch + 1) % every and batch + 1 != steps:
                return
            metrics = "  ".join(f"{k} {float(v):.4f}" for k, v in sorted((logs or {}).items()))
            log.debug("batch %d/%d  %s", batch + 1, steps, metrics)

    return BatchProgress()
