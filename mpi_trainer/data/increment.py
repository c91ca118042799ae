"""Random data increment: a worker's fixed block plus a seeded random draw each round.

Semantics (from the originating system): a worker always trains on its fixed
block, and each round adds a random draw from the rest of the training set.
The draw grows by one step per round until the worker's share reaches
``absolute_factor`` of the training set. A step is ``min_gap`` samples, or
``load_factor`` of the training set when ``min_gap`` is 0 (the original
``minGap = total * loadFactor``). With 5 workers (20 % fixed each) and
``absolute_factor = 0.45``, the draw ends at 25 % of the data.

Pure numpy: the draw depends only on the seed, the round and the rank, so the
scheduler can predict what a worker will need and tests can check it by hand.
"""

from __future__ import annotations

import numpy as np

from mpi_trainer.config import IncrementConfig


def step_size(total: int, cfg: IncrementConfig) -> int:
    """Samples added per round: ``min_gap``, or ``load_factor`` of the training set."""
    return cfg.min_gap if cfg.min_gap > 0 else max(1, int(round(cfg.load_factor * total)))


def extra_count(total: int, fixed: int, round_index: int, cfg: IncrementConfig) -> int:
    """How many random samples a worker with ``fixed`` block samples adds in ``round_index``."""
    if not cfg.enabled:
        return 0
    target = int(round(cfg.absolute_factor * total))
    room = max(0, min(target, total) - fixed)
    return min(room, step_size(total, cfg) * (round_index + 1))


def round_samples(total: int, block_sizes: list[int], round_index: int, cfg: IncrementConfig) -> int:
    """Samples all workers train on in ``round_index``: their blocks plus that round's draws.

    The denominator of the ``weighted`` share ``n_w / N_round``, so that the
    shares of one round sum to 1 with or without increment.
    """
    return sum(size + extra_count(total, size, round_index, cfg) for size in block_sizes)


def draw_extra(total: int, fixed_positions: np.ndarray, round_index: int, rank: int, seed: int,
               cfg: IncrementConfig) -> np.ndarray:
    """The round's random draw: sorted training positions outside the fixed block."""
    count = extra_count(total, len(fixed_positions), round_index, cfg)
    if count == 0:
        return np.empty(0, dtype=np.int64)
    rest = np.setdiff1d(np.arange(total), fixed_positions, assume_unique=False)
    rng = np.random.default_rng([seed, rank, round_index])
    return np.sort(rng.choice(rest, size=count, replace=False))


