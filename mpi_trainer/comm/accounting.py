"""What every transport keeps for its rank: who it is, the bytes it sent, the time it waited.

Both the MPI :class:`~mpi_trainer.comm.transport.Transport` and the in-process
:class:`~mpi_trainer.comm.local.LocalTransport` hold one :class:`RankAccounting`, so both
count and renumber alike; the small records their verbs return (:class:`Received`,
:class:`IncomingArray`, :class:`Shrunk`) live here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Received:
    """A message taken off the wire: its payload, sender and size in bytes."""

    payload: Any
    source: int
    nbytes: int


@dataclass
class IncomingArray:
    """A large array whose header has arrived (``shape``, ``dtype``) and whose elements have not yet: the
    transport's ``recv_large_array_body`` hands them over part by part. ``state`` is the transport's own."""

    shape: tuple[int, ...]
    dtype: np.dtype
    source: int
    tag: int
    state: Any = None


@dataclass
class Shrunk:
    """What a shrink left: ``survivors`` are the previous ranks in their new order (new rank = index),
    ``lost`` the previous ranks that failed, ``lost_world`` those ranks' ``MPI_COMM_WORLD`` ranks."""

    survivors: list[int]
    lost: list[int]
    lost_world: list[int]


class RankAccounting:
    """One rank's identity in its communicator, and what it spent there (bytes sent, time waited)."""

    def __init__(self, rank: int, size: int, host: str) -> None:
        self.rank, self.size, self.host = rank, size, host
        self.world_rank = rank  # this rank's number when the job started; a shrink renumbers ``rank`` only
        self.world_ranks = list(range(size))  # the starting rank of each current rank
        self.hosts: list[str] | None = None  # every rank's host, once learned
        self.bytes_sent = 0
        self.total_bytes_sent = 0
        self.wait_wall_seconds = 0.0
        self.wait_cpu_seconds = 0.0

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} on {self.host}"

    def name_ranks(self, ranks: list[int]) -> str:
        """``rank 2 on host node-b, rank 3 on ...`` (the hosts once every rank's is known)."""
        if not self.hosts:
            return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        return ", ".join(f"rank {rank} on host {self.hosts[rank]}" for rank in ranks)

    def count(self, nbytes: int) -> None:
        self.bytes_sent += nbytes
        self.total_bytes_sent += nbytes

    def take_bytes(self) -> int:
        """Bytes this rank sent since the previous call."""
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def add_wait(self, wall_seconds: float, cpu_seconds: float = 0.0) -> None:
        self.wait_wall_seconds += wall_seconds
        self.wait_cpu_seconds += cpu_seconds

    def renumber(self, survivors: list[int]) -> Shrunk:
        """After a shrink: this rank's new number, and who was lost (as previous and starting ranks)."""
        lost = sorted(set(range(self.size)) - set(survivors))
        shrunk = Shrunk(survivors, lost, [self.world_ranks[rank] for rank in lost])
        self.world_ranks = [self.world_ranks[rank] for rank in survivors]
        self.rank, self.size = self.world_ranks.index(self.world_rank), len(survivors)
        if self.hosts:
            self.hosts = [self.hosts[rank] for rank in survivors]
        return shrunk


class AccountedRank:
    """A transport's rank as its :class:`RankAccounting` tells it: who it is and what it spent. Both
    transports are one (each holds its ``accounting``)."""

    accounting: RankAccounting

    @property
    def rank(self) -> int:
        return self.accounting.rank

    @property
    def size(self) -> int:
        return self.accounting.size

    @property
    def workers(self) -> int:
        return self.size - 1

    @property
    def host(self) -> str:
        return self.accounting.host

    @property
    def world_rank(self) -> int:
        return self.accounting.world_rank

    @property
    def world_ranks(self) -> list[int]:
        return self.accounting.world_ranks

    @property
    def hosts(self) -> list[str] | None:
        return self.accounting.hosts

    @hosts.setter
    def hosts(self, hosts: list[str] | None) -> None:
        self.accounting.hosts = hosts

    @property
    def wait_wall_seconds(self) -> float:
        return self.accounting.wait_wall_seconds

    @property
    def wait_cpu_seconds(self) -> float:
        return self.accounting.wait_cpu_seconds

    @property
    def total_bytes_sent(self) -> int:
        return self.accounting.total_bytes_sent

    def describe(self) -> str:
        return self.accounting.describe()

    def take_bytes(self) -> int:
        """Bytes this rank sent since the previous call."""
        return self.accounting.take_bytes()
