"""A worker's walk through its block at ``train.sync_every = k``: batches that carry on across rounds.

With one local epoch per round (k = 0) every round shuffles the block anew.
With k steps per round an epoch of the block spans several rounds, so the
order must outlive the round: :class:`BlockWalk` hands out the next batch of
row indices of one seeded permutation and draws a new permutation (from the
worker's own generator) only when the last one is used up. Every row is used
once before any repeats, and, as in ``fit``, the last batch of an epoch is
partial rather than padded with rows of the next one.
"""

from __future__ import annotations

import numpy as np


class BlockWalk:
    def __init__(self, rng: np.random.Generator, shuffle: bool = True) -> None:
        self.rng = rng
        self.shuffle = shuffle  # False: the block in row order every epoch (``fit(shuffle=False)``)
        self.order = np.empty(0, dtype=np.int64)
        self.position = 0

    def next_rows(self, block_size: int, batch_size: int) -> np.ndarray:
        """Indices into the block of the next batch; a new shuffle when the epoch is spent or the block changed."""
        if self.position >= len(self.order) or len(self.order) != block_size:
            self.order = self.rng.permutation(block_size) if self.shuffle else np.arange(block_size)
            self.position = 0
        rows = self.order[self.position:self.position + batch_size]
        self.position += len(rows)
        return rows
