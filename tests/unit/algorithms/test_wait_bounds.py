"""The default wait bounds: a floor for set-up and the first round, then a multiple of the slowest round."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpi_trainer.algorithms.wait_bounds import (
    ROUND_FLOOR,
    ROUND_MULTIPLE,
    SETUP_SECONDS,
    WORKER_FACTOR,
    WaitBounds,
    for_rank,
)

DOCS = Path(__file__).resolve().parents[3] / "docs" / "fault-tolerance.md"


def test_set_up_and_the_first_round_get_the_floor_then_ten_times_the_slowest_round():
    bounds = WaitBounds()
    assert bounds.setup == 600 and bounds.round == 600  # no round measured yet: it compiles
    bounds.observe(2.0)
    assert bounds.round == 60  # 10 x 2 s is under the floor
    bounds.observe(30.0)
    bounds.observe(5.0)  # a faster round does not shrink the bound
    assert bounds.round == 300
    assert "10 x the slowest round so far, 30 s" in bounds.describe()


def test_explicit_settings_replace_the_derived_bounds():
    bounds = WaitBounds(setup_timeout=45, worker_timeout=20)
    assert bounds.setup == 45 and bounds.round == 20
    bounds.observe(100.0)
    assert bounds.round == 20 and bounds.describe() == "watchdog.worker_timeout=20 s"
    first = WaitBounds(setup_timeout=45)
    assert first.round == 45 and "watchdog.setup_timeout=45 s" in first.describe()


def test_workers_wait_on_the_scheduler_twice_as_long_as_it_waits_on_them():
    assert for_rank(0, 60.0) == 60.0 and for_rank(3, 60.0) == 120.0


@pytest.mark.parametrize("setting, value", [
    ("set-up and the first round", SETUP_SECONDS), ("slowest round multiple", ROUND_MULTIPLE),
    ("round floor", ROUND_FLOOR), ("worker factor", WORKER_FACTOR)])
def test_the_docs_state_the_defaults_the_code_uses(setting, value):
    """docs/fault-tolerance.md's table of default bounds: one row per constant, with its value."""
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\| ([a-z -]+) \| ([0-9.]+) ", DOCS.read_text(), re.M)}
    assert rows.get(setting) == value, rows
