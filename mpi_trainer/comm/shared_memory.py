"""Ranks on a node meet in memory they all map: each rank's slot of an MPI-3 shared window.

MPI's ``Reduce`` moves each rank's buffer through the shared-memory transport's queues in small
fragments and adds on one core in a tree; ``Bcast`` copies through the same queues (Open MPI's
``coll/sm`` component, tried as well, was slower still). The ranks of a node
(``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)``) do without, part by part (:meth:`NodeSlots.parts`),
each rank's slot holding two parts so that the next part is written while the last is read:

* a sum: each rank but the node's first copies part ``i`` of its buffer into its slot; after a
  barrier the first adds every slot's part ``i`` to its own (which stays in cache while they are
  added; or, where the root's own is left out, sums them into it, the first two in one pass), while
  the others copy part ``i + 1`` into the slot's other half;
* a broadcast: the node's first copies part ``i`` into its slot; after a barrier the others copy
  it out, while the first copies part ``i + 1`` into the other half;
* a sum that returns its result (:meth:`NodeSlots.reduce` with ``returned``): the sum's pass, in which the
  node's first also hands part ``i`` of the result into its own slot and the others copy it out at the
  barrier after. On one node the root adds, combines and hands out each :data:`CACHED_BYTES` of a part
  in turn, while it is in cache; across nodes a leader hands part ``i`` out at part ``i + RETURN_LAG``'s
  barrier, once it is back from the root.

A barrier after part ``i + 1`` is written also says that part ``i`` was read, so a half is never
written while it is read. A buffer crosses memory once in and once out, and no rank holds more
than its slot (two parts) besides its buffer. Across nodes each node's first rank leads it: only
the leaders' ``Reduce`` of each part, and their ``Bcast``, cross the network, once per node (a
returned sum's result goes back by ``Ibcast`` as the next part's ``Reduce`` comes in). The
job's rank 0 leads its node. Figures: docs/performance.md (``benchmarks/shared_memory.py``).

The window is allocated at the first collective that uses it (collective itself, so every rank
does it at the same point), for collectives to or from rank 0. Buffers below
:data:`SHARED_MIN_BYTES` keep MPI's collectives, whose latency the barriers would not beat. A job
under fault-tolerant MPI (``fault.survive``) keeps MPI's collectives too: a rank lost between the
barriers must surface as MPI's error, and the shrunk communicator has no window.
``MPI_TRAINER_SHARED_MEMORY=0`` in the job's environment turns this off.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

SHARED_MIN_BYTES = 1 << 20  # below this, MPI's own collectives (their latency beats the barriers)
MIB = 1 << 20
MAX_PART_BYTES = 32 * MIB  # a part past this saves no barrier worth its memory
PARTS_PER_BUFFER = 32  # a buffer passes in this many parts (between 1 MiB and the slots' part size)
# a returned sum's part ``i`` goes to a node's ranks this many parts after it is summed: across nodes the
# leaders' Ibcast of it has the next parts' Reduce to arrive in
RETURN_LAG = 2
CACHED_BYTES = 1 << 20  # the root of a job on one node sums, combines and hands out a part this much at a time
SHM_DIR = "/dev/shm"  # where Open MPI backs a shared window on Linux: the slots take at most an eighth of it
ENV = "MPI_TRAINER_SHARED_MEMORY"  # "0": MPI's collectives for every size


def shared_memory_wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the job may meet in shared memory: not turned off, and not under fault-tolerant MPI."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes")


def slot_part_bytes(ranks: int, directory: str = SHM_DIR) -> int:
    """The slots' part size: :data:`MAX_PART_BYTES`, or less where the node's shared-memory file system is
    small (a container's default 64 MB): all ``ranks``' slots of two parts take at most an eighth of its
    free space. Whole MiB."""
    try:
        stat = os.statvfs(directory)
        free = stat.f_bavail * stat.f_frsize
    except OSError:  # no such file system: Open MPI backs the window elsewhere, sized as its own
        return MAX_PART_BYTES
    return min(MAX_PART_BYTES, free // (8 * 2 * ranks) // MIB * MIB)


class NodeSlots:
    """A slot of two parts per rank in a window every rank of its node maps, and the collectives through it.

    Across nodes the lowest rank of each node leads it: it sums its node's parts and joins the other
    leaders' ``Reduce`` of that part, and takes each part of a broadcast from theirs (``leaders``, the
    communicator of the leaders, on a leader of a job of several nodes; None otherwise). So a part crosses
    the network once per node, not once per rank. The job's root (rank 0) leads its node. ``barrier``:
    the caller's wait for every rank of the node (bounded, sleeping)."""

    def __init__(self, node: Any, leaders: Any, mpi: Any, part_bytes: int = MAX_PART_BYTES,
                 single: bool = True) -> None:
        self.comm, self.leaders, self._mpi, self.single = node, leaders, mpi, single  # single: the job is on one node
        self.rank, self.size = node.Get_rank(), node.Get_size()  # on the node
        self.part_bytes = part_bytes  # the largest part; a buffer's parts are sized by :meth:`parts`
        self.win = mpi.Win.Allocate_shared(2 * part_bytes, 1, comm=node)
        # pages count in a process's memory once touched: a small buffer's parts touch only their start
        self.views = [np.frombuffer(self.win.Shared_query(rank)[0], dtype=np.uint8, count=2 * part_bytes)
                      for rank in range(self.size)]
        self.scratch = np.empty(0, np.uint8)  # a leader's sum of its node's part (made at the first)

    @classmethod
    def for_comm(cls, comm: Any, mpi: Any) -> NodeSlots | None:
        """Slots for ``comm``'s ranks on this node, or None where there is no room for them (collective)."""
        node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
        leader = node.Get_rank() == 0
        leaders = comm.Split(0 if leader else mpi.UNDEFINED, key=comm.Get_rank())
        part = comm.allreduce(slot_part_bytes(node.Get_size()), op=mpi.MIN)  # one size on every rank
        single = node.Get_size() == comm.Get_size()
        if leaders != mpi.COMM_NULL and (single or part < MIB):
            leaders.Free()
        leaders = None if single or leaders == mpi.COMM_NULL else leaders
        if part < MIB:  # no room for the slots on some node: MPI's collectives
            node.Free()
            return None
        return cls(node, leaders, mpi, part, single)

    def free(self) -> None:
        """Give the window and the node's communicators back (collective over the node, and its leaders)."""
        self.views = []
        self.win.Free()
        if self.leaders is not None:
            self.leaders.Free()
        self.comm.Free()

    def half(self, rank: int, index: int, dtype: np.dtype, count: int) -> np.ndarray:
        """The half of ``rank``'s slot that part ``index`` passes through, as ``count`` values of ``dtype``."""
        start = (index % 2) * self.part_bytes
        return self.views[rank][start:start + count * dtype.itemsize].view(dtype)

    def parts(self, size: int, dtype: np.dtype) -> list[tuple[int, int]]:
        """(start, count) of each part of ``size`` values: :data:`PARTS_PER_BUFFER` of whole MiB, from 1 MiB
        to the slots' part size (fewer barriers for a large buffer, little memory for a small one)."""
        wanted = size * dtype.itemsize // PARTS_PER_BUFFER // MIB * MIB
        step = min(self.part_bytes, max(MIB, wanted)) // dtype.itemsize
        return [(start, min(step, size - start)) for start in range(0, size, step)]

    def node_sum(self, values: np.ndarray, index: int, own: bool = True, offset: int = 0) -> None:
        """Add the node's other ranks' part ``index`` to ``values`` (its values from ``offset`` on); with ``own``
        False, ``values`` becomes their sum (it is not read: the first two are added into it in one pass)."""
        others = [self.half(other, index, values.dtype, offset + values.size)[offset:] for other in range(1, self.size)]
        if not own:
            if len(others) >= 2:
                np.add(others.pop(0), others.pop(0), out=values)
            elif others:
                np.copyto(values, others.pop(0))
            else:
                values[...] = 0
        for other in others:
            np.add(values, other, out=values)

    def across(self, values: np.ndarray, is_root: bool) -> None:
        """A leader's part of the leaders' sum of a part into the root's ``values``."""
        if self.leaders is not None:
            self.leaders.Reduce(self._mpi.IN_PLACE if is_root else values, values if is_root else None,
                                op=self._mpi.SUM, root=0)

    def reduce(self, flat: np.ndarray, is_root: bool, barrier: Callable[[], None],
               on_part: Callable[[int, int], None] | None = None, returned: bool = False,
               root_adds: bool = True, on_returned: Callable[[int, int], None] | None = None) -> None:
        """Every rank's ``flat`` added into the root's (the others' buffers are left as they were; with
        ``root_adds`` False the root's own is not added, nor read). ``on_part(start, stop)``: at the root, once a
        stretch of the sum is complete, before the barrier that lets the next part be read (the other ranks
        write the next part meanwhile).

        ``returned``: then the root's result (each stretch as ``on_part`` left it) into every rank's ``flat``, in
        the same pass: part ``i`` of the result goes out while the later parts are summed. A node's first rank
        hands part ``i`` to its node in its own slot and the node's other ranks copy it out at the turn after,
        so a half is never written while it is read. On one node the root sums, hands ``on_part`` and hands
        out each part :data:`CACHED_BYTES` at a time, so that each stretch is added, combined and handed out
        while it is in cache. Across nodes a node's first rank hands part ``i`` out at part
        ``i + RETURN_LAG``'s turn (back from the root by then): the root sends each part of the result back
        to the other leaders (``Ibcast``) as soon as it is made, while the next parts' ``Reduce`` come in, so
        the links carry the sum one way and the result the other at the same time. ``on_returned(start,
        stop)``: at a rank other than the root, once a part of the result is in its ``flat``, in order."""
        parts = self.parts(flat.size, flat.dtype)
        lag = 0 if self.single else RETURN_LAG  # turns between a part's sum and its hand-out by the node's first
        returning: dict[int, Any] = {}  # part index: a leader's Ibcast of that part of the result, under way

        def pass_on(turn: int) -> None:  # at a turn's barrier: the result's parts due then, handed or taken
            index = turn - lag - (self.rank != 0)
            if not returned or not 0 <= index < len(parts) or (self.rank == 0 and self.single):
                return  # (the root of one node handed its part out as it summed it)
            start, count = parts[index]
            if self.rank != 0:
                np.copyto(flat[start:start + count], self.half(0, index, flat.dtype, count))
            else:
                if not is_root and index in returning:
                    returning.pop(index).Wait()
                np.copyto(self.half(0, index, flat.dtype, count), flat[start:start + count])
            if on_returned is not None and not is_root:
                on_returned(start, start + count)

        for index, (start, count) in enumerate(parts):
            mine = flat[start:start + count]
            if self.rank != 0:
                np.copyto(self.half(self.rank, index, flat.dtype, count), mine)
            barrier()
            if self.rank == 0 and self.single:
                self.root_part(mine, index, root_adds, start, on_part, returned)
            elif self.rank == 0:
                values = mine if is_root else self.scratch_part(mine)
                self.node_sum(values, index, own=root_adds or not is_root)
                self.across(values, is_root)
                if is_root and on_part is not None:
                    on_part(start, start + count)
                if returned and self.leaders is not None:
                    returning[index] = self.leaders.Ibcast(mine, root=0)
            pass_on(index)
        for turn in range(len(parts), len(parts) + lag + 1 if returned else len(parts)):
            barrier()
            pass_on(turn)
        if returning:
            self._mpi.Request.Waitall(list(returning.values()))
        barrier()

    def root_part(self, values: np.ndarray, index: int, own: bool, start: int,
                  on_part: Callable[[int, int], None] | None, returned: bool) -> None:
        """The root of a job on one node: its node's part ``index`` summed into ``values`` (at ``start`` in its
        buffer), each :data:`CACHED_BYTES` of it passed to ``on_part`` and, ``returned``, handed out in the root's
        slot while it is in cache (one pass over memory instead of one each)."""
        handed = self.half(0, index, values.dtype, values.size) if returned else None
        step = max(1, CACHED_BYTES // values.itemsize)
        for begin in range(0, values.size, step):
            stop = min(begin + step, values.size)
            self.node_sum(values[begin:stop], index, own, begin)
            if on_part is not None:
                on_part(start + begin, start + stop)
            if handed is not None:
                np.copyto(handed[begin:stop], values[begin:stop])

    def scratch_part(self, mine: np.ndarray) -> np.ndarray:
        """A leader's own part, copied where its node's parts are added to it (its buffer stays as it was)."""
        if self.scratch.nbytes < mine.nbytes:
            self.scratch = np.empty(self.part_bytes, np.uint8)
        values = self.scratch[:mine.nbytes].view(mine.dtype)
        np.copyto(values, mine)
        return values

    def broadcast(self, flat: np.ndarray, barrier: Callable[[], None]) -> None:
        """The root's ``flat`` into every rank's."""
        for index, (start, count) in enumerate(self.parts(flat.size, flat.dtype)):
            mine = flat[start:start + count]
            if self.rank == 0:
                if self.leaders is not None:
                    self.leaders.Bcast(mine, root=0)
                np.copyto(self.half(0, index, flat.dtype, count), mine)
            barrier()
            if self.rank != 0:
                np.copyto(mine, self.half(0, index, flat.dtype, count))
        barrier()
