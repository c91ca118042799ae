"""``mpi_trainer report RUN_DIR``: the run's plots and its end-of-run table, from its files.

Also run by rank 0 at the end of ``train`` (unless ``log.plots = false``). It
reads only the run directory, so it works on a run that is still going or was
cut short, and on a copy of the directory on another machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpi_trainer.persistence.run_files import REPORT_NAME, write_atomic
from mpi_trainer.reporting.plots import write_plots
from mpi_trainer.reporting.rundata import RunData, load_run
from mpi_trainer.reporting.table import format_table, format_totals


@dataclass
class RunReport:
    """What the report wrote: its text and, per PNG, the x values of each plotted series."""

    text: str
    plots: dict[str, dict[str, np.ndarray]]
    run_dir: Path

    def png(self, name: str) -> Path:
        return self.run_dir / f"{name}.png"


def report_text(data: RunData) -> str:
    rows = data.rows()
    parts = [f"run directory: {data.run_dir}"]
    parts.append(format_table(rows) if rows else "no complete round recorded yet")
    parts.append(format_totals(data.summary, len(rows)))
    return "\n\n".join(parts) + "\n"


def make_report(run_dir: str | Path, plots: bool = True) -> RunReport:
    """Write report.txt and (with ``plots``) the PNGs into the run directory."""
    data = load_run(run_dir)
    text = report_text(data)
    write_atomic(data.run_dir / REPORT_NAME, text)
    drawn = write_plots(data, data.run_dir) if plots and data.rounds else {}
    return RunReport(text, drawn, data.run_dir)


def write_report(run_dir: Path) -> None:
    """The end-of-run plots and report.txt; a plotting failure is logged, the run stays a success."""
    from mpi_trainer.logs import get_logger

    log = get_logger()
    try:
        result = make_report(run_dir)
    except Exception as exc:  # the run's files are complete; only the pictures are missing
        log.warning("the report could not be written (%s: %s); run `mpi_trainer report %s` to retry",
                    type(exc).__name__, exc, run_dir, exc_info=True)
        return
    log.info("report: %s and %d plots in %s", result.run_dir / REPORT_NAME, len(result.plots), run_dir)
