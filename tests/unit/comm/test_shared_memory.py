"""The shared-memory collectives' part-by-part passes, with threads as the ranks of one node."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from mpi_trainer.comm import shared_memory
from mpi_trainer.comm.shared_memory import MIB, NodeSlots, shared_memory_wanted, slot_part_bytes

RANKS = 3


class Node:
    """The slots as one node's window maps them, in this process's memory: every thread a rank, each with
    its own :class:`NodeSlots` over the same views."""

    def __init__(self, part_bytes: int = MIB) -> None:
        self.part_bytes = part_bytes
        self.views = [np.zeros(2 * part_bytes, np.uint8) for _ in range(RANKS)]

    def rank(self, rank: int) -> NodeSlots:
        slots = object.__new__(NodeSlots)
        slots.comm, slots.leaders, slots._mpi, slots.single = None, None, None, True
        slots.rank, slots.size, slots.part_bytes = rank, RANKS, self.part_bytes
        slots.views, slots.scratch = self.views, np.empty(0, np.uint8)
        return slots


def as_ranks(work) -> list:
    """``work(rank, barrier)`` on a thread per rank; their results by rank."""
    barrier = threading.Barrier(RANKS, timeout=30)
    results: list = [None] * RANKS
    errors: list = []

    def run(rank: int) -> None:
        try:
            results[rank] = work(rank, barrier.wait)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(RANKS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


# 5.5 parts of 1 MiB: the halves are reused several times, the last part is short
SIZE = (11 * MIB // 2) // 4


def buffers() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=SIZE).astype(np.float32) for _ in range(RANKS)]


def test_a_sum_through_the_slots_is_every_ranks_buffer_added_at_the_root():
    node, given = Node(), buffers()

    def work(rank, barrier):
        mine = given[rank].copy()
        node.rank(rank).reduce(mine, rank == 0, barrier)
        return mine

    summed = as_ranks(work)
    np.testing.assert_array_equal(summed[0], (given[0] + given[1]) + given[2])
    for rank in (1, 2):
        np.testing.assert_array_equal(summed[rank], given[rank])  # the others' buffers are left as they were


def test_a_broadcast_through_the_slots_reaches_every_rank_whole():
    node, given = Node(), buffers()

    def work(rank, barrier):
        mine = given[rank].copy()
        node.rank(rank).broadcast(mine, barrier)
        return mine

    for result in as_ranks(work):
        np.testing.assert_array_equal(result, given[0])


def test_parts_are_a_32nd_of_the_buffer_in_whole_mib_between_1_mib_and_the_slots_part():
    node = Node(part_bytes=32 * MIB).rank(0)
    assert node.parts(100, np.dtype(np.float32)) == [(0, 100)]  # a small buffer: one part
    sizes = {count for _, count in node.parts(400 * MIB // 4, np.dtype(np.float32))}
    assert sizes == {12 * MIB // 4, (400 - 33 * 12) * MIB // 4}  # 12 MiB parts (400 / 32, whole MiB)
    assert {count for _, count in node.parts(4096 * MIB // 4, np.dtype(np.float32))} == {32 * MIB // 4}


def test_the_slots_take_at_most_an_eighth_of_a_small_shared_memory_file_system(monkeypatch):
    monkeypatch.setattr(shared_memory.os, "statvfs", lambda path: SimpleNamespace(f_bavail=64 * 256, f_frsize=4096))
    assert slot_part_bytes(3) == 1 * MIB  # 64 MB free: 3 ranks x 2 parts x 1 MiB <= 8 MB
    monkeypatch.setattr(shared_memory.os, "statvfs", lambda path: SimpleNamespace(f_bavail=32 * 256, f_frsize=4096))
    assert slot_part_bytes(3) == 0  # 32 MB: no room, MPI's collectives


@pytest.mark.parametrize("environ, wanted", [({}, True), ({"MPI_TRAINER_SHARED_MEMORY": "0"}, False),
                                             ({"OMPI_MCA_mpi_ft_enable": "1"}, False)])
def test_shared_memory_is_off_when_asked_and_under_fault_tolerant_mpi(environ, wanted):
    assert shared_memory_wanted(environ) is wanted


def integer_buffers(count: int) -> list[np.ndarray]:
    """Integer-valued buffers, whose float32 sums are exact in any order."""
    rng = np.random.default_rng(1)
    return [rng.integers(-1000, 1000, size=SIZE).astype(np.float32) for _ in range(count)]


def halve(flat: np.ndarray, told: list[tuple[int, int]]) -> Any:
    """An ``on_part`` that halves each part of the root's sum in place (exact), noting which it was told of."""
    def on_part(start: int, stop: int) -> None:
        told.append((start, stop))
        flat[start:stop] *= np.float32(0.5)
    return on_part


@pytest.mark.parametrize("cached", [shared_memory.CACHED_BYTES, 300_000])
@pytest.mark.parametrize("root_adds", [True, False])
def test_a_sum_returned_through_the_slots_gives_every_rank_the_roots_result_as_on_part_left_it(root_adds, cached,
                                                                                             monkeypatch):
    """With ``root_adds`` False the root's buffer (NaN here) is neither added nor read: it takes the others' sum.
    The root is told of its sum, and hands it out, a stretch of ``cached`` bytes at a time (less than a part,
    and not dividing it, in the second case)."""
    monkeypatch.setattr(shared_memory, "CACHED_BYTES", cached)
    node, given, told = Node(), integer_buffers(RANKS), []
    if not root_adds:
        given[0][:] = np.nan

    expected = ((given[0] if root_adds else 0) + given[1] + given[2]) * np.float32(0.5)
    arrived: dict[int, list] = {1: [], 2: []}  # each other rank's parts of the result, whole when told

    def work(rank, barrier):
        mine = given[rank].copy()

        def landed(start, stop):
            arrived[rank].append((start, stop, bool(np.array_equal(mine[start:stop], expected[start:stop]))))

        node.rank(rank).reduce(mine, rank == 0, barrier, halve(mine, told) if rank == 0 else None, returned=True,
                               root_adds=root_adds, on_returned=None if rank == 0 else landed)
        return mine

    for result in as_ranks(work):
        np.testing.assert_array_equal(result, expected)
    for parts in arrived.values():
        assert parts[0][0] == 0 and parts[-1][1] == SIZE and all(whole for _, _, whole in parts)
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:])) and len(parts) > 2
    assert told[0][0] == 0 and told[-1][1] == SIZE and all(a[1] == b[0] for a, b in zip(told, told[1:]))
    assert max(stop - start for start, stop in told) == min(cached // 4, MIB // 4)


class Leaders:
    """The leaders' communicator of two nodes, for threads: a blocking ``Reduce`` to the root and an
    ``Ibcast`` from it whose receipt completes at ``Wait``, each call matched by its place in the sequence."""

    def __init__(self) -> None:
        self.cond, self.posted = threading.Condition(), {}

    def member(self, root: bool) -> Any:
        leaders, calls = self, iter(range(1, 1 << 30))

        class Request:
            def __init__(self, call: int, into: np.ndarray | None) -> None:
                self.call, self.into = call, into

            def Wait(self) -> None:  # noqa: N802 - mpi4py's name
                if self.into is not None:
                    self.into[...] = leaders.take(self.call)

        class Member:
            def Reduce(self, send, receive, op, root):  # noqa: N802 - mpi4py's name
                call = next(calls)
                if receive is None:
                    leaders.post(call, send)
                else:
                    receive += leaders.take(call)

            def Ibcast(self, buf, root=0):  # noqa: N802 - mpi4py's name
                call = next(calls)
                if is_root:
                    leaders.post(call, buf)
                    return Request(call, None)
                return Request(call, buf)

        is_root = root
        return Member()

    def post(self, call: int, values: np.ndarray) -> None:
        with self.cond:
            self.posted[call] = values.copy()
            self.cond.notify_all()

    def take(self, call: int) -> np.ndarray:
        with self.cond:
            assert self.cond.wait_for(lambda: call in self.posted, timeout=30)
            return self.posted.pop(call)


@pytest.mark.parametrize("root_adds", [True, False])
def test_a_sum_returned_across_two_nodes_crosses_between_their_leaders_and_reaches_every_rank(root_adds):
    """Two nodes of two ranks: each node sums in its slots, the leaders' Reduce brings the other node's sum
    to the root, and the root's result goes back to the other leader part by part while later parts come in.
    With ``root_adds`` False the root's own buffer (NaN here) is left out, and the other node's leader's kept."""
    nodes, leaders, given, told = [Node(), Node()], Leaders(), integer_buffers(4), []
    if not root_adds:
        given[0][:] = np.nan
    mpi = SimpleNamespace(IN_PLACE=object(), SUM=None, Request=SimpleNamespace(
        Waitall=lambda requests: [request.Wait() for request in requests]))
    barriers = [threading.Barrier(2, timeout=30) for _ in nodes]
    results: list = [None] * 4
    errors: list = []
    arrived: dict[int, list] = {}
    expected = sum(given[1:], given[0].copy() if root_adds else np.zeros(SIZE, np.float32)) * np.float32(0.5)

    def run(job_rank: int) -> None:
        node, rank = divmod(job_rank, 2)
        slots = nodes[node].rank(rank)
        slots.size, slots._mpi, slots.single = 2, mpi, False
        slots.leaders = leaders.member(job_rank == 0) if rank == 0 else None
        mine = given[job_rank].copy()
        arrived[job_rank] = []

        def landed(start, stop):  # at every rank but the root: each part of the result, whole when told
            arrived[job_rank].append((start, stop, bool(np.array_equal(mine[start:stop], expected[start:stop]))))

        try:
            slots.reduce(mine, job_rank == 0, barriers[node].wait, halve(mine, told) if job_rank == 0 else None,
                         returned=True, root_adds=root_adds, on_returned=None if job_rank == 0 else landed)
            results[job_rank] = mine
        except Exception as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)
            for barrier in barriers:
                barrier.abort()

    threads = [threading.Thread(target=run, args=(job_rank,)) for job_rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for result in results:
        np.testing.assert_array_equal(result, expected)
    assert arrived[0] == []
    for job_rank in (1, 2, 3):  # told of every part, in order, once it is whole
        parts = arrived[job_rank]
        assert parts[0][0] == 0 and parts[-1][1] == SIZE and all(whole for _, _, whole in parts)
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert len(told) == len(nodes[0].rank(0).parts(SIZE, np.dtype(np.float32))) > 2
