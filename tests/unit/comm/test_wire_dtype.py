"""Wire formats for weights: exact for float32, within the format's rounding for 16 bits; one sum verb."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.comm.wire_dtype import WireFormat


def test_float32_passes_weights_through_unchanged():
    weights = np.random.default_rng(0).normal(size=100).astype(np.float32)
    wire = WireFormat("float32")
    assert wire.encode(weights) is weights
    np.testing.assert_array_equal(wire.decode(wire.encode(weights)), weights)


@pytest.mark.parametrize(("name", "mantissa_bits"), [("float16", 10), ("bfloat16", 7)])
def test_sixteen_bit_formats_halve_the_bytes_and_round_to_nearest(name, mantissa_bits):
    weights = np.random.default_rng(1).normal(scale=0.1, size=10_000).astype(np.float32)
    wire = WireFormat(name)
    encoded = wire.encode(weights)
    assert encoded.nbytes == weights.nbytes // 2 and wire.itemsize == 2
    decoded = wire.decode(encoded)
    normal = np.abs(weights) > 2.0**-14  # float16's smallest normal number: below it precision is absolute
    relative = np.abs(decoded - weights)[normal] / np.abs(weights)[normal]
    assert relative.max() <= 2.0 ** -(mantissa_bits + 1) * 1.0001  # half a unit in the last place
    assert decoded.dtype == np.float32


def test_bfloat16_rounds_ties_to_even_and_keeps_specials():
    wire = WireFormat("bfloat16")
    # 1 + 2**-8 lies halfway between 1 and 1 + 2**-7: ties go to the even pattern, 1.0
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, np.inf, -np.inf, np.nan, 3e38], dtype=np.float32)
    decoded = wire.decode(wire.encode(values))
    assert decoded[0] == 1.0 and decoded[1] == 1 + 2**-6
    assert np.isposinf(decoded[2]) and np.isneginf(decoded[3]) and np.isnan(decoded[4])
    assert decoded[5] == pytest.approx(3e38, rel=2**-8)


def test_decode_writes_into_the_float32_buffer_it_is_given():
    wire = WireFormat("float16")
    out = np.zeros(3, dtype=np.float32)
    assert wire.decode(wire.encode(np.array([0.5, -2.0, 8.0], dtype=np.float32)), out) is out
    assert out.tolist() == [0.5, -2.0, 8.0]


def test_unknown_format_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"one of \['float32', 'float16', 'bfloat16'\]. Received: 'int8'"):
        WireFormat("int8")


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_sum_to_root_adds_every_rank_in_float32_and_counts_wire_bytes(name):
    """Halves and quarters are exact in every format, so the root's float32 sum must match to the bit."""
    wire, size, n = WireFormat(name), 3, 1000
    world = LocalWorld(size)
    transports = world.transports()
    parts = {rank: (np.arange(n) % 64 * (rank + 1) / 4).astype(np.float32) for rank in range(size)}

    def role(rank):
        summed = wire.sum_to_root(transports[rank], parts[rank].copy(), timeout=30)
        return summed, transports[rank].take_bytes()

    seen = world.run({rank: (lambda rank=rank: role(rank)) for rank in range(size)}, timeout=60)
    root_sum, root_bytes = seen[0]
    assert root_sum.dtype == np.float32 and root_bytes == 0
    np.testing.assert_array_equal(root_sum, parts[0] + parts[1] + parts[2])
    for rank in (1, 2):
        np.testing.assert_array_equal(seen[rank][0], parts[rank])  # a worker's own values are left as they were
        assert seen[rank][1] == n * wire.itemsize  # 16 bits halve what a worker sends


def test_landing_is_the_float32_buffer_itself_only_for_float32():
    out = np.zeros(5, np.float32)
    assert WireFormat("float32").landing(out) is out
    landing = WireFormat("bfloat16").landing(out)
    assert landing is not out and landing.dtype == np.uint16 and landing.size == 5


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_16_bit_sum_in_segments_is_the_sum_of_the_rounded_contributions(monkeypatch, name):
    """Segments and chunks smaller than the vector (and not dividing it): the same float32 sum, in rank order."""
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.SEGMENT", 1000)
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.CHUNK", 256)
    wire, size, n = WireFormat(name), 3, 3333
    world = LocalWorld(size)
    transports = world.transports()
    rng = np.random.default_rng(3)
    parts = {rank: rng.normal(size=n).astype(np.float32) if rank else np.zeros(n, np.float32) for rank in range(size)}
    seen = world.run({rank: (lambda rank=rank: (wire.sum_to_root(transports[rank], parts[rank].copy(), timeout=30),
                                                transports[rank].take_bytes())) for rank in range(size)}, timeout=60)
    expected = np.zeros(n, np.float32)
    for rank in (1, 2):
        expected += wire.decode(wire.encode(parts[rank]))
        assert seen[rank][1] == n * 2
    np.testing.assert_array_equal(seen[0][0], expected)


def test_encode_and_decode_write_into_the_buffers_they_are_given():
    values = np.random.default_rng(4).normal(size=70_001).astype(np.float32)
    for name in ("float16", "bfloat16"):
        wire = WireFormat(name)
        out, back = wire.empty(values.size), np.empty(values.size, np.float32)
        assert wire.encode(values, out) is out and wire.decode(out, back) is back
        np.testing.assert_array_equal(back, wire.decode(wire.encode(values)))
