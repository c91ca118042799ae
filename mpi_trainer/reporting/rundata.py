"""A run directory read back for the report: rounds.csv and summary.json.

Works on a run still in progress or cut short: rounds.csv is flushed row by
row, so at worst its last line is torn, and that line is left out.
summary.json is replaced atomically after a round, at most once a second, and at
the end; it may be missing only before the first round ends.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mpi_trainer.errors import InputError
from mpi_trainer.persistence.run_files import ROUNDS_NAME, SUMMARY_NAME

PER_WORKER_COLUMNS = ("block_sizes", "worker_train_seconds")


def read_complete_rows(path: Path) -> list[dict[str, str]]:
    """The CSV's rows, less a torn last line (no newline yet, or fewer cells than the header)."""
    text = path.read_text(encoding="utf-8")
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    reader = csv.DictReader(io.StringIO(text))
    return [row for row in reader if None not in row.values() and None not in row]


def _value(column: str, cell: str) -> Any:
    if column in PER_WORKER_COLUMNS:
        return split_per_worker(cell)
    if cell == "":
        return math.nan
    try:
        return float(cell)
    except ValueError:
        return cell


@dataclass
class RunData:
    """Numbers per round (``column -> list``, NaN where a cell is empty), plus the summary."""

    run_dir: Path
    columns: dict[str, list[Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> list[int]:
        return [int(r) for r in self.columns.get("round", [])]

    def has(self, column: str) -> bool:
        values = self.columns.get(column, [])
        return any(v == v and v != [] for v in values)  # v == v is False for NaN

    def rows(self) -> list[dict[str, Any]]:
        names = list(self.columns)
        return [dict(zip(names, values)) for values in zip(*self.columns.values())]

    @property
    def workers(self) -> int:
        if "workers" in self.summary:
            return int(self.summary["workers"])
        sizes = self.columns.get("block_sizes", [])
        return max((len(s) for s in sizes), default=0)


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory; a directory without rounds.csv is a usage error."""
    run_dir = Path(run_dir)
    path = run_dir / ROUNDS_NAME
    if not path.is_file():
        raise InputError(f"No {ROUNDS_NAME} in the run directory. Received: run_dir={str(run_dir)!r}; "
                         f"expected the --run-dir of an `mpi_trainer train` run that finished a round")
    rows = read_complete_rows(path)
    names = list(rows[0]) if rows else []
    columns = {name: [_value(name, row[name]) for row in rows] for name in names}
    summary_path = run_dir / SUMMARY_NAME
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.is_file() else {}
    return RunData(run_dir, columns, summary)


def split_per_worker(cell: Any) -> list[float]:
    """A "v1;v2;..." cell of rounds.csv (one value per worker rank, from rank 1) as numbers."""
    text = str(cell if cell is not None else "").strip()
    return [float(value) for value in text.split(";")] if text else []
