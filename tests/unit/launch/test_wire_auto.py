"""aggregation.wire_dtype = "auto": the narrow wire only where the measured link is slow enough for
halving the bytes to pay for the casts."""

from __future__ import annotations

import logging

import pytest

from mpi_trainer.comm.local import LocalTransport, LocalWorld
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.config import load_config
from mpi_trainer.launch import wire_choice
from mpi_trainer.launch.wire_choice import WireChoice, narrow_pays, resolve_wire


@pytest.mark.parametrize("link, cast, narrow", [
    (12.5e6, 1e-9, True),  # 100 Mbit/s: 2 bytes saved take 160 ns, a cast 1 ns
    (10e9, 1e-9, False),  # shared memory at 10 GB/s: 2 bytes take 0.2 ns, less than the cast
    (2e9, 1e-9, False),  # exactly at the break-even: no gain, float32
])
def test_the_narrow_wire_is_chosen_only_where_it_saves_time(link, cast, narrow):
    assert narrow_pays(link, cast) is narrow
    assert WireChoice(link, cast, "float16" if narrow else "float32").break_even == pytest.approx(2e9)


def chosen_wires() -> dict[int, str]:
    cfg = load_config({"aggregation": {"wire_dtype": "auto"}})
    world = LocalWorld(3)
    transports = world.transports()
    return world.run({rank: (lambda rank=rank: resolve_wire(transports[rank], cfg).aggregation.wire_dtype)
                      for rank in range(3)}, timeout=60)


@pytest.mark.parametrize("cast, wire", [(1.0, "float32"), (1e-15, "float16")])  # casts that never pay, or always
def test_across_nodes_every_rank_takes_rank_zeros_choice_from_the_timed_links_and_it_is_said_why(
        monkeypatch, caplog, cast, wire):
    monkeypatch.setattr(LocalTransport, "node_layout", lambda self: (1, [self.rank]))  # a node per rank
    monkeypatch.setattr(wire_choice, "cast_seconds_per_value", lambda: cast)
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    assert chosen_wires() == {0: wire, 1: wire, 2: wire}
    assert f"aggregation.wire_dtype = auto: {wire} (the slowest link moves" in caplog.text


def test_on_one_node_every_rank_takes_float32_without_timing_a_link(monkeypatch, caplog):
    def no_probe(*args):
        raise AssertionError("a link was timed")

    monkeypatch.setattr(wire_choice, "probe_links", no_probe)
    monkeypatch.setattr(wire_choice, "cast_seconds_per_value", lambda: 1e-15)  # casts that would pay on any link
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    assert chosen_wires() == {0: "float32", 1: "float32", 2: "float32"}
    assert "aggregation.wire_dtype = auto: float32 (every rank is on one node" in caplog.text


def test_an_unresolved_auto_is_not_a_wire_format():
    with pytest.raises(ValueError, match="Received: 'auto'"):
        WireFormat("auto")
