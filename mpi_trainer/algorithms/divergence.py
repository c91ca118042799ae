"""Divergence that stays finite: a loss climbing above where it started, an accuracy fallen to chance.

The NaN guard sees only values that stop being finite. A learning rate far too
large can instead send the model to chance with every number finite (Adam at
1e6: eight rounds at chance accuracy, exit 0). :class:`DivergenceWatch` follows the
scored rounds and names the divergence once either sign has held for ``rounds``
rounds in a row:

* the run's loss (``val_loss``, else ``test_loss``, else ``train_loss``, whichever the
  first scored round has) above its value in that first round; the training loss, which
  swings from round to round without a held-out split to smooth it, counts when it is above
  in ``rounds`` of the last ``2 * rounds`` rounds, so a loss that oscillates upwards is named
  as well as one that climbs;
* for classes, the accuracy (``val_``, ``test_``, else ``train_accuracy``) at or below
  chance (one over the number of classes) plus half of it, after an earlier round
  had risen above that, or while the loss is above twice the loss of a model that
  guesses every class alike (``2 ln(classes)``: a model that merely learnt nothing
  yet sits near ``ln(classes)``, one that diverged far above it).

Pure Python on the rounds' rows, so the scheduler decides and tests drive it with numbers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

LOSS_COLUMNS = ("val_loss", "test_loss", "train_loss")
ACCURACY_COLUMNS = ("val_accuracy", "test_accuracy", "train_accuracy")
CHANCE_MARGIN = 0.5  # accuracy within chance x (1 + this) counts as chance


def _finite(row: Mapping[str, Any], column: str) -> float | None:
    try:
        value = float(row.get(column, math.nan))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _first_column(row: Mapping[str, Any], columns: tuple[str, ...]) -> str | None:
    return next((column for column in columns if _finite(row, column) is not None), None)


class DivergenceWatch:
    """``update(row)`` per round; returns a sentence naming the divergence on the round it is confirmed."""

    def __init__(self, rounds: int, classes: int | None) -> None:
        self.rounds = rounds  # 0: off
        self.chance = 1.0 / classes if classes else None
        self.loss_column: str | None = None
        self.start_loss: float | None = None
        self.accuracy_column: str | None = None
        self.rose_above_chance = False
        self.loss_streak = 0
        self.recent_above: deque[bool] = deque(maxlen=2 * max(rounds, 1))  # the training loss's last rounds
        self.chance_streak = 0
        self.reported = False

    def start_from(self, rows: list[Mapping[str, Any]]) -> DivergenceWatch:
        """Replay a resumed run's earlier rounds (no report for them)."""
        for row in rows:
            self.update(row)
        self.reported = False
        return self

    def update(self, row: Mapping[str, Any]) -> str | None:
        if self.rounds <= 0:
            return None
        if self.loss_column is None:
            self.loss_column = _first_column(row, LOSS_COLUMNS)
            self.start_loss = _finite(row, self.loss_column) if self.loss_column else None
            if self.chance is not None:
                self.accuracy_column = _first_column(row, ACCURACY_COLUMNS)
        cause = self._loss_sign(row) or self._chance_sign(row)
        if cause and not self.reported:
            self.reported = True
            return cause
        return None

    def _loss_sign(self, row: Mapping[str, Any]) -> str | None:
        loss = _finite(row, self.loss_column) if self.loss_column else None
        if loss is None or self.start_loss is None:
            return None
        self.loss_streak = self.loss_streak + 1 if loss > self.start_loss else 0
        self.recent_above.append(loss > self.start_loss)
        above = sum(self.recent_above)
        if self.loss_column == "train_loss" and self.loss_streak < self.rounds and above >= self.rounds \
                and self.recent_above[-1]:
            return (f"{self.loss_column} {loss:.6g} has been above its first round's {self.start_loss:.6g} in "
                    f"{above} of the last {len(self.recent_above)} rounds, oscillating")
        if self.loss_streak >= self.rounds:
            return (f"{self.loss_column} {loss:.6g} has been above its first round's {self.start_loss:.6g} for "
                    f"{self.loss_streak} rounds")
        return None

    def _chance_sign(self, row: Mapping[str, Any]) -> str | None:
        accuracy = _finite(row, self.accuracy_column) if self.accuracy_column else None
        if accuracy is None or self.chance is None:
            return None
        at_chance = accuracy <= self.chance * (1 + CHANCE_MARGIN)
        self.rose_above_chance = self.rose_above_chance or not at_chance
        loss = _finite(row, self.loss_column) if self.loss_column else None
        blown_up = loss is not None and loss > 2 * math.log(1 / self.chance)
        self.chance_streak = self.chance_streak + 1 if at_chance and (self.rose_above_chance or blown_up) else 0
        if self.chance_streak >= self.rounds:
            why = "after rising above it" if self.rose_above_chance else f"with {self.loss_column} {loss:.6g}"
            return (f"{self.accuracy_column} {accuracy:.4f} has been at chance ({self.chance:.4f}, one class in "
                    f"{round(1 / self.chance)}) for {self.chance_streak} rounds {why}")
        return None
