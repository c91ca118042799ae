"""Keras callbacks on the scheduler, at round granularity (:func:`mpi_trainer.fit`'s ``callbacks``).

A round plays the part of a Keras epoch: ``on_train_begin``, then for each
round ``on_epoch_begin(round)`` and ``on_epoch_end(round, logs)`` with the
round's ``rounds.csv`` row (numbers only) as ``logs``, and ``on_train_end``.
``self.model`` is the scheduler's global model, holding the round's aggregated
weights at ``on_epoch_end``. A callback that sets ``model.stop_training = True``
ends the job after that round on every rank. Keras' own ``CallbackList`` runs
them, so ``EarlyStopping``, ``CSVLogger`` and ``ModelCheckpoint`` behave as in
``model.fit``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def numeric_logs(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numbers (not its ``;``-joined per-worker strings or an empty winner)."""
    return {key: float(value) for key, value in row.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


class RoundCallbacks:
    def __init__(self, callbacks: Sequence[Any], model: Any, rounds: int) -> None:
        import keras

        self.model = model
        self.callbacks = keras.callbacks.CallbackList(list(callbacks), model=model, epochs=rounds, verbose=0)
        self.last_logs: dict[str, float] = {}

    def begin(self, first_round: int) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()
        self.callbacks.on_epoch_begin(first_round)

    def round_end(self, round_index: int, row: Mapping[str, Any]) -> bool:
        """Run ``on_epoch_end``; True when a callback asked to stop. The next round's
        ``on_epoch_begin`` follows at once (the next round starts when this one is recorded)."""
        self.last_logs = numeric_logs(row)
        self.callbacks.on_epoch_end(round_index, self.last_logs)
        stop = bool(getattr(self.model, "stop_training", False))
        if not stop:
            self.callbacks.on_epoch_begin(round_index + 1)
        return stop

    def end(self) -> None:
        self.callbacks.on_train_end({k: v for k, v in self.last_logs.items() if not math.isnan(v)})
