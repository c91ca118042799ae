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
"""

from __future__ import annotations

from typing import Any

import numpy as np


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
