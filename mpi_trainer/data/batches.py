"""One shuffled epoch of in-memory arrays as a Keras ``PyDataset``: the input feed off TensorFlow.

JAX and PyTorch have no tf.data. A ``PyDataset`` is Keras' own
backend-neutral input: ``fit`` asks it for batch ``i`` and moves it to the
device. The order is drawn by the worker's seeded generator, as on
TensorFlow, so a resumed worker repeats the orders it would have drawn.
Each batch gathers its rows on demand: no shuffled copy of the whole block.
"""

from __future__ import annotations

import math

import keras
import numpy as np


class ShuffledBatches(keras.utils.PyDataset):
    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int, order: np.ndarray,
                 sample_weight: np.ndarray | None = None) -> None:
        # One worker thread, no processes: batches come in order on the training thread.
        super().__init__(workers=1, use_multiprocessing=False)
        self.x, self.y, self.batch_size, self.order = x, y, batch_size, order
        self.sample_weight = sample_weight

    def __len__(self) -> int:
        return math.ceil(len(self.order) / self.batch_size)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        if self.sample_weight is None:
            return self.x[rows], self.y[rows]
        return self.x[rows], self.y[rows], self.sample_weight[rows]
