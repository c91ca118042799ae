"""The post-local SGD schedule as plain numbers: which rounds are warm-up, how many steps each runs."""

from __future__ import annotations

import pytest

from mpi_trainer.algorithms.sync_schedule import LOCAL_EPOCH, SyncSchedule, schedule_for
from mpi_trainer.config import TrainConfig


def test_without_a_warm_up_every_round_runs_sync_every():
    schedule = SyncSchedule.plan(5, 0, 1, [719, 718], 64)
    assert schedule.warmup_rounds == 0
    assert [schedule.steps(r) for r in range(4)] == [5, 5, 5, 5]
    assert not schedule.in_warmup(0) and not schedule.closes_warmup_epoch(0)


def test_a_warm_up_lasts_its_epochs_of_the_largest_block_then_switches():
    # 719 rows at 64 per batch: 12 steps per local epoch; every step a round for 2 epochs
    schedule = SyncSchedule.plan(LOCAL_EPOCH, 2, 1, [700, 719], 64)
    assert (schedule.warmup_rounds, schedule.rounds_per_warmup_epoch) == (24, 12)
    assert [schedule.steps(r) for r in (0, 23, 24, 30)] == [1, 1, LOCAL_EPOCH, LOCAL_EPOCH]
    assert [r for r in range(30) if schedule.closes_warmup_epoch(r)] == [11, 23]


def test_warm_up_rounds_of_several_steps_round_an_epoch_up():
    schedule = SyncSchedule.plan(8, 1, 5, [719, 718], 64)  # 12 steps per epoch in rounds of 5: 3 rounds
    assert (schedule.warmup_rounds, schedule.rounds_per_warmup_epoch) == (3, 3)
    assert [schedule.steps(r) for r in range(5)] == [5, 5, 5, 8, 8]


def test_schedule_for_reads_the_train_section_and_the_block_plan():
    train = TrainConfig(batch_size=256, sync_every=3, sync_warmup_epochs=1, sync_warmup_every=1)
    schedule = schedule_for(train, [(0, 719), (719, 1437)])
    assert schedule == SyncSchedule(3, 1, 3, 3)
    assert "rounds 0-2 are the warm-up" in schedule.describe() and "3 local steps" in schedule.describe()


@pytest.mark.parametrize("sync_every, expected", [(0, "one local epoch"), (4, "4 local steps")])
def test_the_log_line_names_the_phase_after_the_warm_up(sync_every, expected):
    assert SyncSchedule(sync_every).describe() == f"every round is {expected}"
