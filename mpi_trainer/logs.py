"""Console and file logging tagged with the rank, and the run directory's record files."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

LOGGER_NAME = "mpi_trainer"
_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG}


def setup_logging(rank: int, size: int, host: str, verbosity: int) -> logging.Logger:
    """Timestamped console log; workers speak at verbosity 2 only, rank 0 from 1."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    logger.propagate = False
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(
        f"%(asctime)s [rank {rank}/{size} {host}] %(levelname)s %(message)s", "%H:%M:%S"))
    level = _LEVELS[verbosity] if rank == 0 else (logging.DEBUG if verbosity >= 2 else logging.WARNING)
    handler.setLevel(level)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger


def add_log_file(path: Path) -> None:
    """Everything rank 0 logs, at every level, also goes to ``path``."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(logging.DEBUG)
    logger.addHandler(handler)


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old or the new file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


class RoundLog:
    """``rounds.csv``: header fixed at the first row, one row per round, flushed and synced."""

    def __init__(self, path: Path, fieldnames: list[str]) -> None:
        self.path = path
        self.fieldnames = fieldnames
        is_new = not path.exists() or path.stat().st_size == 0
        if not is_new:
            self._adopt_columns()
        self._handle = path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._handle, fieldnames=self.fieldnames, extrasaction="raise")
        if is_new:
            self._writer.writeheader()
            self._sync()

    def _adopt_columns(self) -> None:
        """A resumed run's file written with other columns: rewrite it (atomically) to match.

        Columns that are new get empty cells in the earlier rows; columns only
        the file has are kept, after ours, empty in new rows. Appending rows of
        another width would leave a file that no CSV reader can take.
        """
        with self.path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            existing = list(reader.fieldnames or [])
            if existing == self.fieldnames:
                return
            rows = list(reader)
        self.fieldnames = self.fieldnames + [c for c in existing if c not in self.fieldnames]
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.fieldnames, restval="")
        writer.writeheader()
        writer.writerows(rows)
        write_atomic(self.path, buffer.getvalue())

    def _sync(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())

    def write(self, row: dict[str, Any]) -> None:
        unknown = set(row) - set(self.fieldnames)
        if unknown:
            raise ValueError(f"rounds.csv has no columns {sorted(unknown)}; columns: {self.fieldnames}")
        self._writer.writerow({k: _fmt(row.get(k, "")) for k in self.fieldnames})
        self._sync()

    def close(self) -> None:
        self._handle.close()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.10g}"
    return value


def read_rounds(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))
