"""How many local steps each round runs: post-local SGD's "often early, rarely later".

Averaging once per local epoch needs more rounds to an accuracy than one
process needs epochs: early on, the workers' models move far apart between
averagings. Post-local SGD synchronises every step (or every few steps) for a
warm-up, while the weights change fastest, then switches to long local runs.

A round is always one synchronisation: one broadcast, one aggregation and one
row of rounds.csv, so ``train.epochs`` counts rounds in both phases. The
warm-up is given in local epochs (``train.sync_warmup_epochs``) because that is
what users of such tools size it in; it lasts ``warmup_epochs`` times the
rounds that one epoch of the largest block takes at ``train.sync_warmup_every``
steps per round. Every rank derives the same schedule from the config and the
block plan, so no order has to carry it, and a resumed run (which re-plans
the blocks for its worker count) finds its phase from the round index alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mpi_trainer.algorithms.step_budget import steps_per_round
from mpi_trainer.config import TrainConfig

LOCAL_EPOCH = 0  # steps per round meaning "one local epoch of the block"


@dataclass(frozen=True)
class SyncSchedule:
    sync_every: int  # after the warm-up: steps per round, LOCAL_EPOCH for one local epoch
    warmup_every: int = 1  # steps per round during the warm-up
    warmup_rounds: int = 0  # rounds the warm-up lasts (0: no warm-up)
    rounds_per_warmup_epoch: int = 1  # warm-up rounds one local epoch of the largest block takes
    rounds_per_epoch: int = 1  # after the warm-up, the same (1 when a round is a local epoch)

    @classmethod
    def plan(cls, sync_every: int, warmup_epochs: int, warmup_every: int, block_sizes: Sequence[int],
             batch_size: int) -> SyncSchedule:
        """The schedule for these blocks: the warm-up covers ``warmup_epochs`` epochs of the largest block."""
        steps = steps_per_round(max(block_sizes), batch_size)
        per_epoch = math.ceil(steps / sync_every) if sync_every != LOCAL_EPOCH else 1
        if warmup_epochs == 0:
            return cls(sync_every, rounds_per_epoch=per_epoch)
        per_warmup_epoch = math.ceil(steps / warmup_every)
        return cls(sync_every, warmup_every, warmup_epochs * per_warmup_epoch, per_warmup_epoch, per_epoch)

    def steps(self, round_index: int) -> int:
        """Local steps per worker in this round; LOCAL_EPOCH for one local epoch."""
        return self.warmup_every if self.in_warmup(round_index) else self.sync_every

    def in_warmup(self, round_index: int) -> bool:
        return round_index < self.warmup_rounds

    def closes_warmup_epoch(self, round_index: int) -> bool:
        """Whether this warm-up round completes a local epoch (of the largest block)."""
        return self.in_warmup(round_index) and (round_index + 1) % self.rounds_per_warmup_epoch == 0

    def closes_epoch(self, round_index: int) -> bool:
        """Whether this round completes a local epoch of the largest block (every round does at
        ``LOCAL_EPOCH``); ``evaluation.every = 0`` scores these."""
        if self.in_warmup(round_index):
            return self.closes_warmup_epoch(round_index)
        return (round_index - self.warmup_rounds + 1) % self.rounds_per_epoch == 0

    def describe(self) -> str:
        """One line for the log: the phases in rounds."""
        after = "one local epoch" if self.sync_every == LOCAL_EPOCH else f"{self.sync_every} local steps"
        if not self.warmup_rounds:
            return f"every round is {after}"
        return (f"rounds 0-{self.warmup_rounds - 1} are the warm-up, {self.warmup_every} local step(s) each "
                f"({self.rounds_per_warmup_epoch} rounds per local epoch); from round {self.warmup_rounds} "
                f"each round is {after}")


def schedule_for(train: TrainConfig, block_bounds: Sequence[tuple[int, int]]) -> SyncSchedule:
    """The schedule ``train.sync_every`` and ``train.sync_warmup_*`` give for this block plan."""
    sizes = [end - start for start, end in block_bounds]
    return SyncSchedule.plan(train.sync_every, train.sync_warmup_epochs, train.sync_warmup_every, sizes,
                             train.batch_size)
