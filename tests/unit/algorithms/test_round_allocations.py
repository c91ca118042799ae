"""Rank 0's per-round passes over the weights allocate nothing of the model's size (tracemalloc).

NumPy reports its array buffers to tracemalloc, so a full-size temporary shows in the peak. The
outer step and the NaN check run in place over chunks; a 16-bit sum holds one segment per rank,
not a 16-bit copy of every contribution. The one full-size array a round may allocate is its
aggregate, which becomes the next global model.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.algorithms.passes import all_finite
from mpi_trainer.comm.wire_dtype import WireFormat

SIZE = 1_000_000  # 4 MB of float32
MODEL_BYTES = SIZE * 4


def peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["momentum", "nesterov", "adam"])
def test_the_outer_step_and_the_nan_check_allocate_no_full_size_temporary(name):
    rng = np.random.default_rng(0)
    weights = rng.normal(size=SIZE).astype(np.float32)
    aggregate = weights + np.float32(0.01)
    outer = OuterOptimizer(OuterSettings(name=name, learning_rate=0.7, momentum=0.9), [(0, SIZE - 1000)], threads=2)
    outer.step(weights, aggregate.copy(), out=np.empty_like(weights))  # the first step allocates the state
    assert peak_bytes(lambda: outer.step(weights, aggregate, out=aggregate)) < MODEL_BYTES / 8
    assert peak_bytes(lambda: all_finite(aggregate, threads=2)) < MODEL_BYTES / 8
    aggregate[SIZE // 2] = np.nan
    assert not all_finite(aggregate)


class GatheringRoot:
    """Rank 0 of three, whose gather lands every worker's segment of ``contributions`` (in the wire dtype)
    without allocating: what MPI does into the buffer it is given."""

    rank, size = 0, 3

    def __init__(self, contributions: np.ndarray) -> None:
        self.contributions, self.at = contributions, 0

    def gather(self, buf: np.ndarray, out: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        n = buf.size
        out[0] = buf
        for rank in (1, 2):
            out[rank] = self.contributions[self.at:self.at + n]
        self.at += n


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_16_bit_sum_holds_segments_not_copies(monkeypatch, name):
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.SEGMENT", SIZE // 16)
    wire = WireFormat(name)
    contributions = wire.encode(np.full(SIZE, 0.5, np.float32))
    wire.sum_to_root(GatheringRoot(contributions), np.zeros(SIZE, np.float32))  # thread pools warm
    root, summed = GatheringRoot(contributions), np.zeros(SIZE, np.float32)  # the sum lands in the root's zeros
    # two segments of three ranks (3/16 of a model here); one 16-bit copy of a contribution would be half
    assert peak_bytes(lambda: wire.sum_to_root(root, summed)) < MODEL_BYTES / 3
    np.testing.assert_array_equal(summed, np.ones(SIZE, np.float32))
