"""What every transport keeps for its rank: who it is, the bytes it sent, the time it waited.

Shared by the MPI :class:`~mpi_trainer.comm.transport.Transport` and the in-process
:class:`~mpi_trainer.comm.local.LocalTransport`, so both count alike, and the small
records their verbs return (:class:`Received`, :class:`Shrunk`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Received:
    """A message taken off the wire: its payload, sender and size in bytes."""

    payload: Any
    source: int
    nbytes: int



@dataclass
class Shrunk:
    """What a shrink left: ``survivors`` are the previous ranks in their new order (new rank = index),
    ``lost`` the previous ranks that failed, ``lost_world`` those ranks' ``MPI_COMM_WORLD`` ranks."""

    survivors: list[int]
    lost: list[int]
    lost_world: list[int]


class RankAccounting:
    """What every transport keeps for its rank: who it is, the bytes it sent, the time it waited.

    Shared by :class:`Transport` and the in-process
    :class:`~mpi_trainer.comm.local.LocalTransport`, so both count alike.
    """

    def _start_accounting(self, rank: int, size: int, host: str) -> None:
        self.rank, self.size, self.host = rank, size, host
        self.world_rank = rank  # this rank's number when the job started; a shrink renumbers ``rank`` only
        self.world_ranks = list(range(size))  # the starting rank of each current rank
        # Seconds a wait without a timeout of its own may last (None: for ever; a job sets it), what
        # this rank is doing (named when a wait runs out), and every rank's host once learned.
        self.bound: float | None = None
        self.phase = "set-up"
        self.hosts: list[str] | None = None
        self.bytes_sent = 0
        self.total_bytes_sent = 0
        self.wait_wall_seconds = 0.0
        self.wait_cpu_seconds = 0.0

    @property
    def workers(self) -> int:
        return self.size - 1

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} on {self.host}"

    def _limit(self, timeout: float | None) -> float | None:
        """A verb's own ``timeout``, else the transport's ``bound``."""
        return self.bound if timeout is None else timeout

    def name_ranks(self, ranks: list[int]) -> str:
        """``rank 2 on host node-b, rank 3 on ...`` (the hosts once every rank's is known)."""
        if not self.hosts:
            return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        return ", ".join(f"rank {rank} on host {self.hosts[rank]}" for rank in ranks)

    def _count(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.total_bytes_sent += nbytes

    def take_bytes(self) -> int:
        """Bytes this rank sent since the previous call."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def _renumber(self, survivors: list[int]) -> Shrunk:
        """After a shrink: this rank's new number, and who was lost (as previous and starting ranks)."""
        lost = sorted(set(range(self.size)) - set(survivors))
        shrunk = Shrunk(survivors, lost, [self.world_ranks[rank] for rank in lost])
        self.world_ranks = [self.world_ranks[rank] for rank in survivors]
        self.rank, self.size = self.world_ranks.index(self.world_rank), len(survivors)
        if self.hosts:
            self.hosts = [self.hosts[rank] for rank in survivors]
        return shrunk
