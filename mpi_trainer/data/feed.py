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


def fit_arguments(x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator,
                  backend: str | None = None) -> dict[str, Any]:
    """Keyword arguments for ``model.fit`` that train one epoch over ``(x, y)`` in a random order.

    ``backend`` defaults to the running Keras backend.
    """
    import keras

    order = rng.permutation(len(x))
    if (backend or keras.backend.backend()) != "tensorflow":
        from mpi_trainer.data.batches import ShuffledBatches

        return {"x": ShuffledBatches(x, y, batch_size, order), "shuffle": False}
    import tensorflow as tf

    features, labels = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
    dataset = (tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
               .map(lambda rows: (tf.gather(features, rows), tf.gather(labels, rows))).prefetch(1))
    options = tf.data.Options()
    options.autotune.enabled = False
    return {"x": dataset.with_options(options), "shuffle": False}  # the order above is the shuffle
