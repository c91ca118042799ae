"""A run that diverges while every number stays finite is reported, and train.divergence may stop it."""

from __future__ import annotations

import math

import pytest

from mpi_trainer.algorithms.divergence import DivergenceWatch
from mpi_trainer.config import config_from_dict
from mpi_trainer.errors import ConfigError


def _rows(losses, accuracies=None):
    accuracies = accuracies or [math.nan] * len(losses)
    return [{"val_loss": loss, "val_accuracy": acc, "test_loss": loss} for loss, acc in zip(losses, accuracies)]


def _first_report(watch, rows):
    for index, row in enumerate(rows):
        cause = watch.update(row)
        if cause:
            return index, cause
    return None


def test_a_loss_above_its_start_for_several_rounds_is_named_once():
    watch = DivergenceWatch(3, classes=None)
    found = _first_report(watch, _rows([1.0, 0.8, 1.2, 1.5, 0.9, 1.1, 1.3, 1.6, 2.0]))
    assert found == (7, "val_loss 1.6 has been above its first round's 1 for 3 rounds")
    assert watch.update(_rows([3.0])[0]) is None  # reported once


def test_a_training_loss_that_oscillates_above_its_start_is_named_without_a_held_out_split():
    rows = [{"train_loss": loss} for loss in [1.0, 0.7, 1.3, 0.8, 1.4, 0.9, 1.6, 1.0, 1.8]]
    index, cause = _first_report(DivergenceWatch(3, classes=None), rows)
    assert index == 6 and cause == ("train_loss 1.6 has been above its first round's 1 in 3 of the last 6 "
                                    "rounds, oscillating")
    held_out = [{"val_loss": row["train_loss"]} for row in rows]  # a held-out loss: consecutive rounds only
    assert _first_report(DivergenceWatch(3, classes=None), held_out) is None
    falling = [{"train_loss": loss} for loss in [1.0, 1.1, 0.7, 1.05, 0.6, 0.5, 0.55, 0.5]]  # noisy, but learning
    assert _first_report(DivergenceWatch(3, classes=None), falling) is None


def test_a_falling_loss_and_a_learning_model_are_not_divergence():
    watch = DivergenceWatch(3, classes=10)
    assert _first_report(watch, _rows([2.3, 1.0, 0.9, 0.95, 0.97, 0.99], [0.3, 0.8, 0.9, 0.9, 0.91, 0.9])) is None
    # learnt nothing yet, but nothing blew up either: near ln(10), at chance
    slow = DivergenceWatch(3, classes=10)
    assert _first_report(slow, _rows([2.31, 2.30, 2.29, 2.28, 2.27], [0.1, 0.11, 0.1, 0.12, 0.1])) is None


def test_accuracy_at_chance_with_a_blown_up_loss_is_divergence_even_from_the_start():
    """Adam at learning rate 1e6 on digits: the loss falls from millions, the accuracy never leaves chance."""
    rows = _rows([4.3e6, 3.0e6, 1.7e6, 8.6e5, 8.5e5], [0.12, 0.0833, 0.104, 0.0833, 0.0833])
    index, cause = _first_report(DivergenceWatch(3, classes=10), rows)
    assert index == 2 and cause == ("val_accuracy 0.1040 has been at chance (0.1000, one class in 10) for 3 rounds "
                                    "with val_loss 1.7e+06")


def test_accuracy_that_falls_back_to_chance_is_divergence():
    rows = _rows([2.3, 1.0, 2.0, 2.1, 2.2], [0.5, 0.9, 0.1, 0.12, 0.11])
    assert _first_report(DivergenceWatch(3, classes=10), rows)[0] == 4
    assert _first_report(DivergenceWatch(0, classes=10), rows) is None  # off


def test_bad_divergence_settings_are_refused_naming_them():
    with pytest.raises(ConfigError, match=r"`train.divergence` .*Received: train.divergence='loud'"):
        config_from_dict({"train": {"divergence": "loud"}})
    with pytest.raises(ConfigError, match=r"`train.divergence_rounds` must be > 0"):
        config_from_dict({"train": {"divergence_rounds": 0}})


