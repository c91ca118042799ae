"""The Chrome-trace timeline: events per rank and phase, atomic writes, resumed runs (a fit's timeline.json:
tests/unit/trainer/test_policies.py)."""

from __future__ import annotations

import json

import pytest

from mpi_trainer.reporting.timeline import Timeline


def test_events_are_complete_events_in_microseconds_with_one_row_per_rank(tmp_path):
    timeline = Timeline()
    timeline.name_rank(0, "rank 0 scheduler")
    timeline.name_rank(1, "rank 1 worker")
    timeline.add(1, "train", 100.0, 100.25, 0)
    timeline.add(0, "evaluate", 100.5, 100.5125, 0)
    timeline.write(tmp_path / "timeline.json")
    trace = json.loads((tmp_path / "timeline.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["name"], e["ts"], e["dur"], e["args"]["round"]) for e in events] == [
        (1, "train", 100_000_000.0, 250_000.0, 0), (0, "evaluate", 100_500_000.0, 12_500.0, 0)]
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0 scheduler", 1: "rank 1 worker"}
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.json"]  # no temporary file left


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match=r"Received: phase='sleep'; expected one of \['train'"):
        Timeline().add(0, "sleep", 0.0, 1.0, 0)


def test_a_resumed_run_keeps_the_earlier_attempts_events(tmp_path):
    first = Timeline()
    first.name_rank(1, "rank 1 worker")
    first.add(1, "train", 1.0, 2.0, 0)
    first.write(tmp_path / "timeline.json")
    again = Timeline.load(tmp_path / "timeline.json")
    again.add(1, "train", 3.0, 4.0, 1)
    assert [e["args"]["round"] for e in again.to_json()["traceEvents"] if e["ph"] == "X"] == [0, 1]
    (tmp_path / "timeline.json").write_text("{torn")
    assert Timeline.load(tmp_path / "timeline.json").events == []


def test_the_log_switches_are_booleans_checked_before_training():
    from mpi_trainer.config import load_config
    from mpi_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"`log.timeline` must be of type bool. Received: log.timeline=1"):
        load_config("configs/quickstart.toml", ["log.timeline=1"])
    log = load_config("configs/quickstart.toml").log
    assert (log.plots, log.tensorboard, log.timeline) == (True, True, False)
