"""The run's PNG plots, drawn from its files with matplotlib's Agg backend (no display needed).

* ``accuracy_loss.png``: test (and validation, train) accuracy and loss per round, the best
  round marked, and where early stopping ended the run;
* ``round_time.png``: each round's wall time split into training (fastest worker), waiting for
  stragglers (slowest − fastest worker), communication, aggregation, evaluation and the rest;
* ``worker_train_time.png``: each worker's train time per round (slowest/fastest when the run
  has no per-worker column) and, below, its block size (rebalancing shows as moving lines);
* ``traffic.png``: bytes per round and cumulative, with the minimum the algorithm must move.

Each ``plot_*`` returns its Figure; :func:`plotted_series` reads back the x values of every
labelled line and bar series, which is what the tests check.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.reporting.rundata import RunData

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FIGSIZE = (10, 5.5)
DPI = 110
MB = 1e6


def _use_agg() -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: works on nodes with no display


def _subplots(rows: int = 1, columns: int = 1, **options: Any) -> tuple[Figure, Any]:
    """A figure of the plots' size and its axes: one, or an array of them (as ``pyplot.subplots`` gives)."""
    _use_agg()
    import matplotlib.pyplot as plt

    return plt.subplots(rows, columns, figsize=FIGSIZE, dpi=DPI, **options)


def _series(data: RunData, column: str) -> np.ndarray:
    return np.asarray(data.columns.get(column, [math.nan] * len(data.rounds)), dtype=float)


def _style(ax: Axes, ylabel: str, title: str) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)


def minimum_round_bytes(model_bytes: int, workers: int) -> int:
    """The least a round moves: 2·M·W, the state down to each worker and each worker's into the sum (under
    best-of the workers not elected add zeros of the same size; under SSP every update goes both ways)."""
    return 2 * model_bytes * workers


def best_round(data: RunData) -> int | None:
    """The summary's best round for its monitor; else the round of highest test accuracy."""
    best = data.summary.get("best_round")
    if isinstance(best, int) and best in data.rounds:
        return best
    accuracy = _series(data, "test_accuracy")
    if not len(accuracy) or np.all(np.isnan(accuracy)):
        return None
    return data.rounds[int(np.nanargmax(accuracy))]


def _mark_stops(ax: Axes, data: RunData, values: np.ndarray, best: int | None) -> None:
    if best is not None:
        index = data.rounds.index(best)
        ax.plot([best], [values[index]], "*", color="tab:red", markersize=14, label=f"best round {best}")
        ax.axvline(best, color="tab:red", linestyle=":", alpha=0.6)
    if data.summary.get("stop_reason") == "early_stopping" and data.rounds:
        ax.axvline(data.rounds[-1], color="black", linestyle="--", alpha=0.7,
                   label=f"early stop after round {data.rounds[-1]}")


def _scored(data: RunData, column: str, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Rounds and values of ``column`` where it was measured, so that the rounds ``evaluation.every``
    leaves unscored (NaN) do not cut the line into invisible pieces."""
    values = scale * _series(data, column)
    kept = ~np.isnan(values)
    return np.asarray(data.rounds)[kept], values[kept]


def plot_accuracy_loss(data: RunData) -> Figure:
    fig, (acc_ax, loss_ax) = _subplots(1, 2)
    best = best_round(data)
    for split in ("test", "val", "train"):
        if data.has(f"{split}_accuracy"):
            acc_ax.plot(*_scored(data, f"{split}_accuracy", 100), "o-", markersize=3, label=f"{split} accuracy")
        if data.has(f"{split}_loss"):
            loss_ax.plot(*_scored(data, f"{split}_loss"), "o-", markersize=3, label=f"{split} loss")
    _mark_stops(acc_ax, data, 100 * _series(data, "test_accuracy"), best)
    _mark_stops(loss_ax, data, _series(data, "test_loss"), best)
    _style(acc_ax, "accuracy (%)", "Accuracy per round")
    _style(loss_ax, "loss (the model's loss function)", "Loss per round")
    for ax in (acc_ax, loss_ax):
        if ax.get_legend_handles_labels()[1]:  # a model without an accuracy metric leaves its axis unlabelled
            ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def time_parts(data: RunData) -> dict[str, np.ndarray]:
    """Seconds per round in each part of the wall time; "other" is what the parts leave of it."""
    fastest, slowest = _series(data, "train_seconds_min"), _series(data, "train_seconds_max")
    parts = {
        "train (fastest worker)": fastest,
        "waiting for stragglers (slowest − fastest)": slowest - fastest,
        "communication": _series(data, "comm_seconds"),
        "aggregation": _series(data, "aggregate_seconds"),
        "evaluation": _series(data, "eval_seconds"),
    }
    parts = {name: np.nan_to_num(values) for name, values in parts.items()}
    parts["other (records, re-cutting blocks)"] = np.maximum(
        0.0, np.nan_to_num(_series(data, "wall_seconds")) - sum(parts.values()))
    return parts


def plot_round_time(data: RunData) -> Figure:
    fig, ax = _subplots()
    bottom = np.zeros(len(data.rounds))
    for name, seconds in time_parts(data).items():
        ax.bar(data.rounds, seconds, bottom=bottom, label=name, width=0.8)
        bottom += seconds
    ax.plot(data.rounds, _series(data, "wall_seconds"), "k_", markersize=12, label="round wall time")
    _style(ax, "seconds", "Where each round's wall time went")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def _per_worker(data: RunData, column: str) -> np.ndarray | None:
    """Rounds × workers, or None when the run has no such column (NaN where a round lacks one)."""
    if not data.has(column):
        return None
    cells = data.columns[column]
    width = max(len(cell) for cell in cells)
    return np.array([list(cell) + [math.nan] * (width - len(cell)) for cell in cells], dtype=float)


def plot_worker_train_time(data: RunData) -> Figure:
    sizes = _per_worker(data, "block_sizes")
    fig, axes = _subplots(2 if sizes is not None else 1, 1, sharex=True, squeeze=False)
    times = _per_worker(data, "worker_train_seconds")
    time_ax = axes[0][0]
    if times is not None:
        for index in range(times.shape[1]):
            time_ax.plot(data.rounds, times[:, index], "o-", markersize=3, label=f"worker rank {index + 1}")
    else:
        time_ax.plot(data.rounds, _series(data, "train_seconds_max"), "o-", markersize=3, label="slowest worker")
        time_ax.plot(data.rounds, _series(data, "train_seconds_min"), "o-", markersize=3, label="fastest worker")
    _style(time_ax, "train seconds", "Each worker's training time per round")
    if sizes is not None:
        time_ax.set_xlabel("")  # the block panel below carries the shared round axis
    time_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    if sizes is not None:
        size_ax = axes[1][0]
        for index in range(sizes.shape[1]):
            size_ax.step(data.rounds, sizes[:, index], where="mid", marker=".", label=f"worker rank {index + 1} block")
        _style(size_ax, "samples", "Block size per worker (changes when blocks are re-cut)")
        size_ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def plot_traffic(data: RunData) -> Figure:
    fig, ax = _subplots()
    per_round = np.nan_to_num(_series(data, "bytes")) / MB
    ax.bar(data.rounds, per_round, width=0.6, color="tab:blue", alpha=0.6, label="sent in the round")
    total_ax = ax.twinx()
    total_ax.plot(data.rounds, np.cumsum(per_round), "o-", color="tab:orange", markersize=3,
                  label="cumulative (right axis)")
    minimum = _minimum_mb(data)
    if minimum is not None:
        formula, per_round_minimum = minimum
        ax.plot(data.rounds, [per_round_minimum] * len(data.rounds), "--", color="black", linewidth=1.5,
                label=f"minimum per round: {formula}")
        total_ax.plot(data.rounds, per_round_minimum * np.arange(1, len(data.rounds) + 1), ":",
                      color="black", label="cumulative minimum (right axis)")
    _style(ax, "MB per round", "Traffic per round (all ranks, 1 MB = 10⁶ bytes)")
    total_ax.set_ylabel("cumulative MB")
    ax.set_ylim(bottom=0)
    total_ax.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels(), total_ax.get_legend_handles_labels()
    ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize="small",
              loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    fig.tight_layout()
    return fig


def _minimum_mb(data: RunData) -> tuple[str, float] | None:
    """The legend's formula and the minimum MB per round, when summary.json says the model size."""
    summary = data.summary
    if not summary.get("model_bytes") or not data.workers:
        return None
    model_bytes = int(summary["model_bytes"])
    text = (f"2·M·W, M = {model_bytes:,} model bytes, W = {data.workers} workers "
            f"(the model to each worker and back)")
    return text, minimum_round_bytes(model_bytes, data.workers) / MB


PLOTS = {"accuracy_loss": plot_accuracy_loss, "round_time": plot_round_time,
         "worker_train_time": plot_worker_train_time, "traffic": plot_traffic}


def plotted_series(fig: Figure) -> dict[str, np.ndarray]:
    """Every labelled line's and bar series' x values, read back from the figure."""
    series: dict[str, np.ndarray] = {}
    for ax in fig.get_axes():
        for line in ax.get_lines():
            label = str(line.get_label())  # an artist's label is a str once it is drawn
            if not label.startswith("_"):
                series[label] = np.asarray(line.get_xdata(), dtype=float)
        for container in ax.containers:
            series[str(container.get_label())] = np.array([p.get_x() + p.get_width() / 2 for p in container])
    return series


def save_figure(fig: Figure, path: Path) -> None:
    """Written under a temporary name and renamed: a viewer never opens half a PNG."""
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    os.replace(tmp, path)
    _use_agg()
    import matplotlib.pyplot as plt

    plt.close(fig)


def write_plots(data: RunData, out_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """All four PNGs into ``out_dir``; returns each plot's :func:`plotted_series`."""
    drawn = {}
    for name, plot in PLOTS.items():
        fig = plot(data)
        drawn[name] = plotted_series(fig)
        save_figure(fig, Path(out_dir) / f"{name}.png")
    return drawn
