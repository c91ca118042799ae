"""The default wait bounds: a floor for set-up and the first round, then a multiple of the slowest round."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mpi_trainer.algorithms.wait_bounds import (
    ROUND_FLOOR,
    ROUND_MULTIPLE,
    SETUP_SECONDS,
    STALL_FACTOR,
    WORKER_FACTOR,
    StallWatch,
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


def test_the_launchers_default_stall_bound_arms_at_the_first_round_and_grows_with_the_longest_gap():
    watch = StallWatch(started=100.0)
    assert watch.limit is None and not watch.expired(100.0 + 10 * SETUP_SECONDS)  # set-up: the ranks' bounds
    watch.progressed(130.0)  # the first row, 30 s after the start (set-up and compilation)
    assert watch.limit == STALL_FACTOR * ROUND_MULTIPLE * 30
    watch.progressed(132.0)  # a fast round does not shrink it
    assert watch.limit == 900
    assert not watch.expired(132.0 + 899) and watch.expired(132.0 + 901)
    assert "3 x 10 x the longest gap between rounds so far, 30 s" in watch.describe()


def test_the_default_stall_bound_has_a_floor_and_disarms_while_the_run_is_complete():
    watch = StallWatch(started=0.0)
    watch.progressed(1.0)
    assert watch.limit == STALL_FACTOR * ROUND_FLOOR  # 10 x 1 s is under the floor
    watch.progressed(2.0, complete=True)  # fit returned: the script may go on without rounds
    assert watch.limit is None and not watch.expired(10_000.0)
    watch.progressed(3.0)  # a second fit on the run directory trains more rounds: armed again
    assert watch.expired(3.0 + STALL_FACTOR * ROUND_FLOOR + 1)


def test_an_explicit_stall_bound_counts_from_the_attempts_start_and_is_named():
    watch = StallWatch(explicit=5.0, started=0.0)
    assert watch.expired(5.5) and not watch.expired(4.5)
    watch.progressed(4.0, complete=True)
    assert watch.limit == 5.0 and watch.expired(9.5)
    assert watch.describe() == "5 s (watchdog.stall_seconds)"


def test_a_workers_own_communicator_is_bounded_by_the_rounds_as_its_main_one_is():
    """Synchronous SGD's step sums run on the workers' own communicator: a worker that goes silent inside an
    epoch is named within the round bound there too, not only after the set-up bound."""
    from types import SimpleNamespace

    from mpi_trainer.trainer.round_protocol import RoundClock

    main, workers = SimpleNamespace(rank=1, bound=45.0), SimpleNamespace(rank=0, bound=45.0)
    clock = RoundClock(main, WaitBounds(setup_timeout=45, worker_timeout=20), workers, None)
    clock.tick()
    assert workers.bound == 45.0  # no round has ended yet
    clock.tick()
    assert main.bound == workers.bound == 40.0  # a worker's bound: twice the scheduler's round bound
