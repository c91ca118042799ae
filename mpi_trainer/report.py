"""Human-readable views of per-round records."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _num(row: Mapping[str, Any], key: str) -> float:
    return float(row[key])


def format_round_line(row: Mapping[str, Any], epochs: int) -> str:
    """The one concise line rank 0 prints per round."""
    return (f"round {int(row['round']) + 1}/{epochs}  acc {_num(row, 'test_accuracy'):.4f}  "
            f"loss {_num(row, 'test_loss'):.4f}  {_num(row, 'wall_seconds'):.2f} s  "
            f"{_num(row, 'bytes') / 1e6:.2f} MB")


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
