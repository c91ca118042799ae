"""``aggregation.wire_dtype = "auto"``: float32, or float16 where the links are slow enough for it to pay.

A value costs 4 bytes on a float32 wire; on a float16 wire 2 bytes plus a cast on the way out and one
on the way in. Rank 0 times a round trip to every worker (:func:`~mpi_trainer.launch.preflight.probe_links`)
and a float16 cast, before set-up, and every rank takes its choice; the log says which and why. A job
whose ranks are all on one node takes float32 without timing anything: its states meet in memory, the
casts would cost more than the bytes they save, and only a float32 wire returns a round's result in
the pass that sums it. (Timed on a loaded node, a round trip through memory once read slower than the
break-even, and the 100M-parameter round of the ``big_models`` suite took 4.6 s on float16 against
2.7 s on float32.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.config import Config
from mpi_trainer.launch.preflight import probe_links
from mpi_trainer.logs import get_logger

PROBE_BYTES = 8 << 20  # the round trip each link is timed with (aggregation.wire_dtype = "auto")
CAST_VALUES = 1 << 22  # the values a float16 cast is timed on


@dataclass(frozen=True)
class WireChoice:
    """What ``aggregation.wire_dtype = "auto"`` measured and chose."""

    link_bytes_per_second: float  # the slowest scheduler-worker link, one way (0: not timed, one node)
    cast_seconds_per_value: float  # a float16 encode and decode of one value
    dtype: Literal["float32", "float16"]
    one_node: bool = False  # every rank is on one node: float32, nothing timed

    @property
    def break_even(self) -> float:
        """The link speed below which halving the bytes saves more time than the casts cost."""
        return 2.0 / self.cast_seconds_per_value

    def describe(self) -> str:
        if self.one_node:
            return (f"aggregation.wire_dtype = auto: {self.dtype} (every rank is on one node: the states meet in "
                    f"memory, where float16's casts cost more than the bytes they save)")
        why = "slower" if self.dtype == "float16" else "faster"
        return (f"aggregation.wire_dtype = auto: {self.dtype} (the slowest link moves "
                f"{self.link_bytes_per_second / 1e6:,.0f} MB/s, {why} than the "
                f"{self.break_even / 1e6:,.0f} MB/s below which float16's half bytes pay for its casts)")


def narrow_pays(link_bytes_per_second: float, cast_seconds_per_value: float) -> bool:
    """Whether a float16 wire is faster than float32: a value costs 4 bytes on the wire in float32, 2 in
    float16 plus its casts (encode on the sender, decode on the receiver)."""
    return 4.0 / link_bytes_per_second > 2.0 / link_bytes_per_second + cast_seconds_per_value


def cast_seconds_per_value() -> float:
    """A float16 encode and decode of one float32 value on this rank (the best of three)."""
    values = np.random.default_rng(0).standard_normal(CAST_VALUES).astype(np.float32)
    narrow, back = np.empty(CAST_VALUES, np.float16), np.empty(CAST_VALUES, np.float32)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(narrow, values, casting="same_kind")
        np.copyto(back, narrow)
        best = min(best, time.perf_counter() - started)
    return best / CAST_VALUES


def resolve_wire(transport: RankTransport, cfg: Config) -> Config:
    """``aggregation.wire_dtype = "auto"``: float32 on one node; across nodes rank 0 times a round trip to every
    worker and a float16 cast, picks the faster wire (:func:`narrow_pays`), and every rank takes its choice.
    The log says which and why."""
    if not cfg.aggregation.wire_dtype_auto:
        return cfg
    _, node_ranks = transport.node_layout()
    choice: WireChoice | None = None
    if len(node_ranks) == transport.size:  # the same on every rank: all on one node, or not
        choice = WireChoice(0.0, 0.0, "float32", one_node=True)
    else:
        seconds = probe_links(transport, PROBE_BYTES, transport.bound)
        if transport.rank == 0:
            link = 2 * PROBE_BYTES / max(max(seconds.values(), default=0.0), 1e-9)
            cast = cast_seconds_per_value()
            choice = WireChoice(link, cast, "float16" if narrow_pays(link, cast) else "float32")
        choice = transport.bcast_object(choice)
    assert choice is not None
    if transport.rank == 0:
        get_logger().info("%s", choice.describe())
    return replace(cfg, aggregation=replace(cfg.aggregation, wire_dtype=choice.dtype))
