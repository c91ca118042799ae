"""What a worker's ``model.fit`` reads each round: its arrays, one shuffled epoch.

On the TensorFlow backend ``model.fit(x, y, shuffle=True)`` builds a tf.data
pipeline with autotuned prefetching. When ``fit`` returns, deleting that
pipeline waits for tf.data's autotuning thread, which sleeps for a period that
doubles while the pipeline lives: on rounds of a few seconds, about one round
in ten then ended 1–2 s late, which is idle time for every other worker in a
synchronous round. The pipeline here does what ``fit`` does (a new random
order every round, batches of ``batch_size``, the last one partial) with
autotuning off and a prefetch of one batch. Other backends do not use tf.data
for arrays and get the arrays as they are.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def fit_arguments(x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator) -> dict[str, Any]:
    """Keyword arguments for ``model.fit`` that train one epoch over ``(x, y)`` in a random order."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return {"x": x, "y": y, "batch_size": batch_size, "shuffle": True}
    import tensorflow as tf

    features, labels = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
    order = rng.permutation(len(x))
    dataset = (tf.data.Dataset.from_tensor_slices(order).batch(batch_size)
               .map(lambda rows: (tf.gather(features, rows), tf.gather(labels, rows))).prefetch(1))
    options = tf.data.Options()
    options.autotune.enabled = False
    return {"x": dataset.with_options(options), "shuffle": False}  # the order above is the shuffle
