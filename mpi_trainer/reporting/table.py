"""Human-readable views of per-round records: rank 0's round line and the end-of-run table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _num(row: Mapping[str, Any], key: str) -> float:
    return float(row[key])


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per-round accuracy, time, traffic and loss, with totals, as in the originating logs."""
    lines = [f"{'round':>5} {'accuracy':>9} {'seconds':>8} {'MB':>8} {'loss':>8}"]
    for row in rows:
        lines.append(f"{int(row['round']):>5} {_num(row, 'test_accuracy'):>9.4f} "
                     f"{_num(row, 'wall_seconds'):>8.2f} {_num(row, 'bytes') / 1e6:>8.3f} "
                     f"{_num(row, 'test_loss'):>8.4f}")
    total_seconds = sum(_num(r, "wall_seconds") for r in rows)
    total_mb = sum(_num(r, "bytes") for r in rows) / 1e6
    lines.append(f"{'total':>5} {'':>9} {total_seconds:>8.2f} {total_mb:>8.3f}")
    return "\n".join(lines)


def format_totals(summary: Mapping[str, Any], rounds: int) -> str:
    """The run's totals from summary.json: its state, time and traffic (set-up and stops included)."""
    state = summary.get("stop_reason", "running")
    if state == "running":
        state = f"running or interrupted after {rounds} rounds"
    lines = [f"status: {state}", f"rounds completed: {summary.get('rounds_completed', rounds)}"]
    if summary.get("best_round") is not None:
        lines.append(f"best round: {summary['best_round']} ({summary.get('monitor', 'test_accuracy')})")
    for key, label in (("final_test_accuracy", "final test accuracy"), ("best_test_accuracy", "best test accuracy")):
        if summary.get(key) is not None:
            lines.append(f"{label}: {float(summary[key]):.4f}")
    if "wall_seconds" in summary:
        lines.append(f"total time: {float(summary['wall_seconds']):.2f} s")
    if "traffic_bytes" in summary:
        lines.append(f"total traffic: {int(summary['traffic_bytes']) / 1e6:.3f} MB "
                     f"(rounds, set-up, checkpoints and stop orders)")
    return "\n".join(lines)
