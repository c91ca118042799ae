"""What a worker's ``model.fit`` reads each round: its arrays, one shuffled epoch.

On the TensorFlow backend ``model.fit(x, y, shuffle=True)`` builds a tf.data
pipeline with autotuned prefetching. When ``fit`` returns, deleting that
pipeline waits for tf.data's autotuning thread, which sleeps for a period that
doubles while the pipeline lives: on rounds of a few seconds, about one round
in ten then ended 1–2 s late, which is idle time for every other worker in a
synchronous round. The pipeline here does what ``fit`` does (a new random
order every round, batches of ``batch_size``, the last one partial) with
autotuning off and a prefetch of one batch. JAX and PyTorch have no tf.data:
they get the same seeded order as a Keras ``PyDataset`` (:mod:`.batches`).

:class:`RowsFeed` is the block feed of rows held in memory, beside the feeds of streamed inputs
(:mod:`mpi_trainer.data.adapters`): whatever the input, a worker's ``model.fit`` reads a feed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mpi_trainer.data.adapters.base import BlockFeed


def fit_arguments(x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator | None,
                  backend: str | None = None, sample_weight: np.ndarray | None = None) -> dict[str, Any]:
    """Keyword arguments for ``model.fit`` that train one epoch over ``(x, y)`` in a random order
    (``rng`` None: in row order, ``fit(shuffle=False)``), each row's loss weighted by ``sample_weight``.

    ``backend`` defaults to the running Keras backend.
    """
    import keras

    order = np.arange(len(x)) if rng is None else rng.permutation(len(x))
    if (backend or keras.backend.backend()) != "tensorflow":
        from mpi_trainer.data.batches import ShuffledBatches

        return {"x": ShuffledBatches(x, y, batch_size, order, sample_weight), "shuffle": False}
    import tensorflow as tf

    columns = [tf.convert_to_tensor(a) for a in (x, y, sample_weight) if a is not None]
    dataset = (tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
               .map(lambda rows: tuple(tf.gather(column, rows) for column in columns)).prefetch(1))
    options = tf.data.Options()
    options.autotune.enabled = False
    return {"x": dataset.with_options(options), "shuffle": False}  # the order above is the shuffle


class RowsFeed(BlockFeed):
    """A round's rows held in memory (a worker's block, plus the round's draw under data increment), read
    as ``model.fit`` reads arrays: one epoch in a new random order when ``shuffle`` (``fit``'s argument),
    the last batch partial, each row's loss weighted by its ``sample_weight``. A round cut short by the
    step budget (``train.max_steps``) trains on the first rows of a permutation seeded by ``subset_seed``."""

    def __init__(self, x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None, shuffle: bool,
                 subset_seed: int) -> None:
        self.x, self.y, self.sample_weight = x, y, sample_weight
        self.shuffle, self.subset_seed = shuffle, subset_seed
        self.units = len(x)

    def steps(self, batch_size: int) -> int:
        return math.ceil(self.units / batch_size)

    def samples(self, batch_size: int, steps: int) -> int:
        return min(self.units, steps * batch_size)

    def fit_input(self, batch_size: int, rng: np.random.Generator, max_steps: int | None) -> dict[str, Any]:
        x, y, weights = self.x, self.y, self.sample_weight
        if max_steps is not None:
            rows = np.random.default_rng(self.subset_seed).permutation(len(x))[:max_steps * batch_size]
            x, y = x[rows], y[rows]
            weights = None if weights is None else weights[rows]
        return fit_arguments(x, y, batch_size, rng if self.shuffle else None, sample_weight=weights)
