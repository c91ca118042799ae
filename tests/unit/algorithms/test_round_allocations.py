"""Rank 0's per-round passes over the weights allocate nothing of the model's size (tracemalloc), and a
worker's copies of its model and optimizer state are made one variable at a time.

NumPy reports its array buffers to tracemalloc, so a full-size temporary shows in the peak. The
outer step and the NaN check run in place over chunks; a 16-bit sum holds one segment per rank,
not a 16-bit copy of every contribution. The one full-size array a round may allocate is its
aggregate, which becomes the next global model; the best round's copy is kept in a file.
"""

from __future__ import annotations

import tracemalloc
from collections import deque
from functools import partial

import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.algorithms.passes import all_finite
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.persistence.optimizer_state import state_parts, state_size, state_vector
from mpi_trainer.persistence.spill import SpilledArray
from mpi_trainer.scheduler.synchronous import CombinedRound

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


class ReducingRoot:
    """Rank 0 of three, whose sum-reduction hands over ``summed`` part by part in one scratch part: what the
    MPI transport does with the workers' contributions."""

    rank, size = 0, 3

    def __init__(self, summed: np.ndarray, part: int) -> None:
        self.summed, self.part = summed, part

    def reduce_sum_parts(self, size, dtype, take, root=0, timeout=None) -> None:
        scratch = np.empty(self.part, dtype)
        for start in range(0, size, self.part):
            values = scratch[:min(self.part, size - start)]
            np.copyto(values, self.summed[start:start + values.size])
            take(start, values)


@pytest.mark.parametrize("wire_name", ["float32", "float16"])
def test_a_round_is_combined_part_by_part_into_the_global_weights_in_place(monkeypatch, wire_name):
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.SEGMENT", SIZE // 32)
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.TAKE_PART", SIZE // 128)  # each segment taken in parts
    wire, rng = WireFormat(wire_name), np.random.default_rng(0)
    weights = rng.standard_normal(SIZE).astype(np.float32)
    workers = wire.decode(wire.encode(weights + np.float32(0.25)))  # what each of the two workers sends, halved
    half = wire.encode(workers / 2)
    aggregate = wire.decode(half) * 2  # the sum of the two halves
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=0.7, momentum=0.9), [(0, SIZE - 1000)],
                           threads=2)
    reference = OuterOptimizer(outer.settings, outer.trainable, threads=2)
    for round_index in range(2):  # the first round allocates the velocity
        expected = reference.step(weights, aggregate)
        root = GatheringRoot(half) if wire_name != "float32" else ReducingRoot(aggregate, SIZE // 16)
        combined = CombinedRound(outer.begin(SIZE), weights, weights)
        peak = peak_bytes(partial(wire.sum_parts_at_root, root, SIZE, combined.take))
        if round_index:  # the aggregate is never a buffer of its own (nor a 16-bit copy): a few parts at most
            assert peak < MODEL_BYTES / 3
        assert combined.cause is None and combined.out is weights
        np.testing.assert_array_equal(weights, expected)  # as the step over the whole aggregate gives


def test_a_non_finite_part_stops_the_step_and_says_whether_the_starting_weights_survive():
    weights = np.ones(SIZE, np.float32)
    summed = np.full(SIZE, 2.0, np.float32)
    summed[SIZE - 10] = np.inf  # in the last part
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=0.7, momentum=0.9), None, threads=2)
    aside = CombinedRound(outer.begin(SIZE), weights, np.empty_like(weights))  # fault.survive: a buffer of its own
    WireFormat("float32").sum_parts_at_root(ReducingRoot(summed, SIZE // 4), SIZE, aside.take)
    assert aside.cause == "non-finite aggregated weights" and aside.before is weights and (weights == 1).all()
    in_place = CombinedRound(outer.begin(SIZE), weights, weights)
    WireFormat("float32").sum_parts_at_root(ReducingRoot(summed, SIZE // 4), SIZE, in_place.take)
    # three parts were stepped in place before the fourth showed the inf: the round's start is gone
    assert in_place.cause == "non-finite aggregated weights" and in_place.before is None
    assert (weights[-SIZE // 4:] == 1).all() and not (weights[:SIZE // 4] == 1).all()


class BroadcastEnd:
    """One end of a two-rank broadcast: the root's parts are kept in ``sent`` (outside what is measured, when
    ``keep`` is off only their sizes), the other rank takes them in order: what MPI does into the buffer given."""

    size = 2

    def __init__(self, rank: int, sent: deque, keep: bool = True) -> None:
        self.rank, self.sent, self.keep = rank, sent, keep

    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        if self.rank == root:
            self.sent.append(buf.copy() if self.keep else buf.size)
        else:
            np.copyto(buf, self.sent.popleft())


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_a_16_bit_broadcast_encodes_and_decodes_segment_by_segment(monkeypatch, name):
    monkeypatch.setattr("mpi_trainer.comm.wire_dtype.SEGMENT", SIZE // 16)
    wire, weights = WireFormat(name), np.random.default_rng(0).standard_normal(SIZE).astype(np.float32)
    root_sizes: deque = deque()
    # the root encodes one segment at a time: no 16-bit copy of the model (that would be half of it)
    assert peak_bytes(lambda: wire.broadcast_from_root(BroadcastEnd(0, root_sizes, keep=False), weights)) \
        < MODEL_BYTES / 8
    assert list(root_sizes) == [SIZE // 16] * 16
    sent: deque = deque()
    wire.broadcast_from_root(BroadcastEnd(0, sent), weights)
    received = np.zeros(SIZE, np.float32)
    assert peak_bytes(lambda: wire.broadcast_from_root(BroadcastEnd(1, sent), received)) < MODEL_BYTES / 8
    np.testing.assert_array_equal(received, wire.decode(wire.encode(weights)))  # what the 16 bits hold


def test_a_new_best_round_is_written_to_its_spilled_copy_and_streamed_back_in_parts(monkeypatch):
    monkeypatch.setattr("mpi_trainer.persistence.spill.PART_VALUES", SIZE // 8)
    weights = np.zeros(SIZE, np.float32)
    best = SpilledArray(weights)
    weights += 1
    assert peak_bytes(lambda: best.store(weights)) < MODEL_BYTES / 8  # no copy of the model in memory
    weights += 1  # the copy is the best round's, not a view of the global weights
    np.testing.assert_array_equal(best.read(), np.ones(SIZE, np.float32))
    sizes: list[int] = []

    def take(part: np.ndarray) -> None:  # a checkpoint writes each part and drops it
        assert part.dtype == np.float32 and (part == 1).all()
        sizes.append(part.size)

    streamed = best.streamed()
    assert peak_bytes(lambda: streamed.deliver(take)) < MODEL_BYTES / 4
    assert streamed.size == SIZE and sizes == [SIZE // 8] * 8
    with pytest.raises(ValueError, match="cannot take 10 float32 values"):
        best.store(np.zeros(10, np.float32))


class Variable:
    def __init__(self, values: np.ndarray, path: str) -> None:
        self.values, self.path, self.shape = values, path, values.shape

    def numpy(self) -> np.ndarray:
        return self.values.copy()  # as a backend's variable does: a host copy

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.numpy() if dtype is None else self.numpy().astype(dtype)


class Optimizer:
    def __init__(self) -> None:
        moments = [np.full((SIZE // 8, 2), rank, np.float32) for rank in range(4)]
        self.variables = [Variable(np.float32(0.1), "learning_rate"), Variable(np.int64(3), "iterations"),
                          *(Variable(m, f"m{i}") for i, m in enumerate(moments))]


def test_an_optimizer_state_vector_is_filled_variable_by_variable():
    optimizer = Optimizer()
    vector = state_vector(optimizer)
    assert vector.size == 1 + SIZE and vector[0] == 3 and vector[-1] == 3
    state_bytes = vector.nbytes
    # the vector and one variable's host copy at a time, not every copy and then their concatenation
    assert peak_bytes(lambda: state_vector(optimizer)) < state_bytes * 1.3


def test_a_workers_optimizer_state_goes_out_one_variable_at_a_time():
    optimizer = Optimizer()
    largest = max(v.values.nbytes for v in optimizer.variables)
    assert sum(part.size for part in state_parts(optimizer)) == state_size(optimizer) == 1 + SIZE
    np.testing.assert_array_equal(np.concatenate(list(state_parts(optimizer))), state_vector(optimizer))
    # sent as they come (a consumer that keeps none): one variable's copy at a time, never the whole vector
    assert peak_bytes(lambda: deque(state_parts(optimizer), maxlen=0)) < largest * 1.5 < MODEL_BYTES / 2


def test_a_workers_weights_are_flattened_from_its_variables_one_at_a_time():
    variables = [Variable(np.full((SIZE // 8, 2), i, np.float32), f"w{i}") for i in range(4)]
    codec, out = WeightCodec([v.shape for v in variables]), np.empty(SIZE, np.float32)
    # what get_weights() would make first: a host copy of every variable at once, a model's size
    assert peak_bytes(lambda: codec.flatten(variables, out=out)) < MODEL_BYTES / 3
    np.testing.assert_array_equal(out, np.repeat(np.arange(4, dtype=np.float32), SIZE // 4))
