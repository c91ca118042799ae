"""``train.sync_every = "auto"``: the steps of a round from the first round's cost against a step's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mpi_trainer.trainer.sync_choice import SHARE, SyncChoice, median_step, not_applicable, steps_for


def test_a_round_takes_the_fewest_steps_that_keep_its_other_cost_under_the_share():
    # 0.1 s besides training, 10 ms a step: 0.1 * 0.8 / (0.2 * 0.01) = 40 steps keep it at 20 %
    assert SHARE == 0.2
    assert steps_for(0.1, 0.01, 1000) == 40
    other, step = 0.1, 0.01
    k = steps_for(other, step, 1000)
    assert other / (other + k * step) <= SHARE < other / (other + (k - 1) * step)
    assert steps_for(0.0, 0.01, 1000) == 1  # a free round: every step
    assert steps_for(0.1, 0.01, 40) == 0  # as many steps as an epoch has: a round per epoch
    assert steps_for(0.1, 0.0, 1000) == 0  # no step measured: a round per epoch


def test_a_workers_step_is_its_median_batch_without_the_first_which_traces():
    assert median_step([5.0, 0.01, 0.03, 0.02]) == 0.02
    assert median_step([0.4]) == 0.4
    assert median_step([]) == 0.0


def report(batches, step, inside):
    return SimpleNamespace(batches=batches, step_seconds=step, batch_seconds=inside)


def test_the_choice_is_made_once_from_the_slowest_worker_and_said():
    choice = SyncChoice(epoch_steps=500)
    assert choice.observe([report(0, 0.0, 0.0)], 1.0) is None and not choice.chosen  # nothing trained yet
    assert choice.observe([report(100, 0.05, 5.0)], 30.0) is None and not choice.chosen  # the first pays the start
    said = choice.observe([report(100, 0.01, 1.0), report(100, 0.02, 1.9)], 2.0)
    # besides training: 2.0 - 1.9 = 0.1 s; the slowest step 20 ms: 0.1 * 0.8 / (0.2 * 0.02) = 20 steps
    assert choice.every == 20 and said.startswith("train.sync_every = auto: 20 steps a round (round 2's cost")
    assert choice.observe([report(100, 1.0, 1.0)], 99.0) is None and choice.every == 20  # held for the fit


def test_a_costly_round_keeps_one_round_an_epoch_and_says_why():
    choice = SyncChoice(epoch_steps=10, seen=1)
    said = choice.observe([report(10, 0.01, 0.1)], 5.0)
    assert choice.every == 0 and choice.chosen and "one round per epoch" in said


@pytest.mark.parametrize("kind, steps_per_epoch, ssp, increment, rebalance, max_steps, why", [
    ("tf.data.Dataset", None, 0, False, False, 0, "the input is not arrays given as `x`"),
    ("arrays", 10, 0, False, False, 0, "steps_per_epoch is given"),
    ("arrays", None, 2, False, False, 0, "aggregation.ssp > 0"),
    ("arrays", None, 0, True, False, 0, "data.increment is enabled"),
    ("arrays", None, 0, False, True, 0, "data.rebalance is on"),
    ("arrays", None, 0, False, False, 100, "train.max_steps is set"),
    ("arrays", None, 0, False, False, 0, None),
])
def test_what_keeps_auto_at_whole_epochs_is_named(kind, steps_per_epoch, ssp, increment, rebalance, max_steps, why):
    assert not_applicable(kind, steps_per_epoch, ssp, increment, rebalance, max_steps) == why
