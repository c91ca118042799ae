"""Ranks on one node meet in memory they all map: each rank's slot of an MPI-3 shared window.

MPI's ``Reduce`` moves each rank's buffer through the shared-memory transport's queues in small
fragments and adds on one core in a tree; ``Bcast`` copies through the same queues (Open MPI's
``coll/sm`` component, tried as well, was slower still). When every rank of a communicator is on
one node (``MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`` keeps them all), the transport does without,
part by part (:data:`~mpi_trainer.comm.interface.REDUCE_PART_BYTES`), each rank's slot holding two
parts so that the next part is written while the last is read:

* a sum: each rank but the root copies part ``i`` of its buffer into its slot; after a barrier the
  root adds every slot's part ``i`` to its own (which stays in cache while they are added), while
  the others copy part ``i + 1`` into the slot's other half;
* a broadcast: the root copies part ``i`` into its slot; after a barrier the others copy it out,
  while the root copies part ``i + 1`` into the other half.

A barrier after part ``i + 1`` is written also says that part ``i`` was read, so a half is never
written while it is read. A buffer crosses memory once in and once out, and no rank holds more
than its slot (two parts) besides its buffer. Figures: docs/performance.md
(``benchmarks/shared_memory.py``).

The window is allocated at the first collective that uses it (collective itself, so every rank
does it at the same point). Buffers below :data:`SHARED_MIN_BYTES` keep MPI's collectives, whose
latency the barriers would not beat. A job under fault-tolerant MPI (``fault.survive``) keeps MPI's
collectives too: a rank lost between the barriers must surface as MPI's error, and the shrunk
communicator has no window. ``MPI_TRAINER_SHARED_MEMORY=0`` in the job's environment turns this off.
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
    """A slot of two parts per rank in a window every rank of a one-node communicator maps, and the
    collectives through it. ``barrier``: the caller's wait for every rank of the node (bounded, sleeping)."""

    def __init__(self, comm: Any, mpi: Any, part_bytes: int = MAX_PART_BYTES) -> None:
        self.comm = comm  # the node's communicator: the same ranks, in the same order
        self.part_bytes = part_bytes  # the largest part; a buffer's parts are sized by :meth:`parts`
        self.win = mpi.Win.Allocate_shared(2 * part_bytes, 1, comm=comm)
        # pages count in a process's memory once touched: a small buffer's parts touch only their start
        self.views = [np.frombuffer(self.win.Shared_query(rank)[0], dtype=np.uint8, count=2 * part_bytes)
                      for rank in range(comm.Get_size())]

    @classmethod
    def for_comm(cls, comm: Any, mpi: Any) -> NodeSlots | None:
        """Slots for ``comm`` when all its ranks share one node, else None (collective over ``comm``)."""
        node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
        if node.Get_size() != comm.Get_size():
            node.Free()
            return None
        part = node.allreduce(slot_part_bytes(node.Get_size()), op=mpi.MIN)  # one size on every rank
        if part < MIB:  # no room for the slots: MPI's collectives
            node.Free()
            return None
        return cls(node, mpi, part)

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

    def reduce(self, flat: np.ndarray, rank: int, root: int, barrier: Callable[[], None]) -> None:
        """Every rank's ``flat`` added into the root's."""
        others = [other for other in range(self.comm.Get_size()) if other != root]
        for index, (start, count) in enumerate(self.parts(flat.size, flat.dtype)):
            if rank != root:
                np.copyto(self.half(rank, index, flat.dtype, count), flat[start:start + count])
            barrier()
            if rank == root:
                values = flat[start:start + count]
                for other in others:
                    np.add(values, self.half(other, index, flat.dtype, count), out=values)
        barrier()

    def reduce_parts(self, size: int, dtype: Any, scratch: np.ndarray, root: int,
                     take: Callable[[int, np.ndarray], None], barrier: Callable[[], None]) -> None:
        """The root's side of the others' :meth:`reduce` of ``size`` values: each part's sum (its own adds
        nothing) handed to ``take(start, values)`` in ``scratch``, which the next part overwrites."""
        dtype = np.dtype(dtype)
        others = [other for other in range(self.comm.Get_size()) if other != root]
        for index, (start, count) in enumerate(self.parts(size, dtype)):
            barrier()
            values = scratch[:count]
            np.copyto(values, self.half(others[0], index, dtype, count))
            for other in others[1:]:
                np.add(values, self.half(other, index, dtype, count), out=values)
            take(start, values)
        barrier()

    def broadcast(self, flat: np.ndarray, rank: int, root: int, barrier: Callable[[], None]) -> None:
        """The root's ``flat`` into every rank's."""
        for index, (start, count) in enumerate(self.parts(flat.size, flat.dtype)):
            if rank == root:
                np.copyto(self.half(root, index, flat.dtype, count), flat[start:start + count])
            barrier()
            if rank != root:
                np.copyto(flat[start:start + count], self.half(root, index, flat.dtype, count))
        barrier()
