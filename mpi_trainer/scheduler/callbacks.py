"""Keras callbacks on the scheduler, at round granularity (:func:`mpi_trainer.fit`'s ``callbacks``).

A round plays the part of a Keras epoch. On rank 0: ``on_train_begin``, then
for each round ``on_epoch_begin(epoch)`` and ``on_epoch_end(epoch, logs)``,
and ``on_train_end``; ``epoch`` is the round plus ``fit``'s ``initial_epoch``.
``logs`` carry Keras' names: ``loss`` and ``<metric>`` (the workers' training
metrics, weighted by their samples), ``val_<metric>`` (the global model on the
validation data, on the rounds it was scored) and, when a test split was
asked for (``data.test_size``), ``test_<metric>``. ``self.model`` is the
scheduler's global model, holding the round's aggregated weights at
``on_epoch_end``. Batch hooks (``on_train_batch_*``) do not run: the batches
are on the workers. A callback that sets ``model.stop_training = True`` ends
the job after that round on every rank; a learning rate it sets on
``model.optimizer`` is the one the workers train the next round with. Keras'
own ``CallbackList`` runs them with a ``History``, which is what ``fit`` returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mpi_trainer.errors import ConfigError


def numeric_logs(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's numbers (not its ``;``-joined per-worker strings or an empty winner)."""
    return {key: float(value) for key, value in row.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def keras_logs(row: Mapping[str, Any], metric_names: Sequence[str]) -> dict[str, float]:
    """A ``rounds.csv`` row under the names ``model.fit`` gives its epoch logs (measured values only)."""
    numbers = numeric_logs(row)
    logs = {}
    for prefix, split in (("", "train_"), ("val_", "val_"), ("test_", "test_")):
        for name in metric_names:
            value = numbers.get(f"{split}{name}", math.nan)
            if math.isfinite(value):
                logs[f"{prefix}{name}"] = value
    return logs


def learning_rate_of(model: Any) -> float | None:
    """The optimizer's learning rate as a number; None when it is a schedule (or there is no optimizer)."""
    import keras
    import numpy as np

    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or isinstance(getattr(optimizer, "_learning_rate", None),
                                       keras.optimizers.schedules.LearningRateSchedule):
        return None
    return float(np.asarray(optimizer.learning_rate))


def check_callbacks(callbacks: Sequence[Any]) -> None:
    """Refuse, before training, a callback that cannot do on rank 0 what it does in ``model.fit``."""
    import keras

    if not all(isinstance(callback, keras.callbacks.Callback) for callback in callbacks):
        kinds = sorted({type(c).__name__ for c in callbacks if not isinstance(c, keras.callbacks.Callback)})
        raise ConfigError(f"`callbacks` must be keras.callbacks.Callback instances. Received: {kinds}")
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise ConfigError("`callbacks`: BackupAndRestore cannot restore a data-parallel run (the weights and "
                              "the round to restart from live on every rank, not in rank 0's model). Received: "
                              "BackupAndRestore; expected checkpoint.every = n in `overrides` and, after an "
                              "interruption, the same fit call with resume=True (or `mpi_trainer launch`)")


class RoundCallbacks:
    def __init__(self, callbacks: Sequence[Any], model: Any, rounds: int, metric_names: Sequence[str],
                 initial_epoch: int = 0) -> None:
        import keras

        self.model = model
        self.metric_names = list(metric_names)
        self.initial_epoch = initial_epoch
        self.history = keras.callbacks.History()
        self.from_user = len(callbacks) > 0  # any besides the History that fit returns
        self.callbacks = keras.callbacks.CallbackList([*callbacks, self.history], model=model,
                                                      epochs=rounds + initial_epoch, verbose=0)
        self.last_logs: dict[str, float] = {}
        self.sent_rate = learning_rate_of(model)

    def begin(self, first_round: int) -> None:
        self.model.stop_training = False
        self.callbacks.on_train_begin()
        self.callbacks.on_epoch_begin(first_round + self.initial_epoch)

    def round_end(self, round_index: int, row: Mapping[str, Any]) -> bool:
        """Run ``on_epoch_end``; True when a callback asked to stop. The next round's
        ``on_epoch_begin`` follows at once (the next round starts when this one is recorded)."""
        self.last_logs = keras_logs(row, self.metric_names)
        epoch = round_index + self.initial_epoch
        self.callbacks.on_epoch_end(epoch, self.last_logs)
        stop = bool(getattr(self.model, "stop_training", False))
        if not stop:
            self.callbacks.on_epoch_begin(epoch + 1)
        return stop

    def changed_learning_rate(self) -> float | None:
        """The learning rate a callback set since the last call (None: unchanged)."""
        rate = learning_rate_of(self.model)
        if rate is None or rate == self.sent_rate:
            return None
        self.sent_rate = rate
        return rate

    def end(self) -> None:
        self.callbacks.on_train_end(dict(self.last_logs))
