"""What a rank's transport offers, whichever carries the bytes.

:class:`~mpi_trainer.comm.transport.Transport` (MPI) and
:class:`~mpi_trainer.comm.local.LocalTransport` (threads in one process) both
satisfy :class:`RankTransport`; the fit's rounds and set-up speak only these
verbs, and one contract test (``tests/transport_contract.py``) runs the same
exchanges through both and expects the same results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mpi_trainer.comm.accounting import IncomingArray, RankAccounting, Received, Shrunk

# A sum-reduction goes in parts of this many bytes. Open MPI's Reduce holds a temporary of its whole
# message at the root (and at inner ranks of its tree), a second copy of the model; in parts it holds one
# part, and each part's additions run in cache (a 100 MB model reduced at 3 ranks: 3x faster).
REDUCE_PART_BYTES = 2 << 20


@runtime_checkable
class RankTransport(Protocol):
    """One rank's verbs: point to point, collectives, byte accounting and failure handling.

    ``bound``: the seconds a wait without a ``timeout`` of its own may last (None: for ever; a job
    sets it). ``phase``: what this rank is doing, named when a wait runs out. ``max_sleep``: the
    longest sleep of a polled wait.
    """

    bound: float | None
    phase: str
    max_sleep: float
    accounting: RankAccounting  # this rank's bytes, and every rank's host once learned (to name them)

    # -- who this rank is, and what it spent ------------------------------------
    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def host(self) -> str: ...

    @property
    def world_rank(self) -> int:
        """This rank's number when the job started (a shrink renumbers :attr:`rank` only)."""

    @property
    def world_ranks(self) -> list[int]:
        """The starting rank of each current rank."""

    @property
    def hosts(self) -> list[str] | None:
        """Every rank's host, once :meth:`learn_hosts` ran."""

    @property
    def workers(self) -> int: ...

    @property
    def wait_wall_seconds(self) -> float: ...

    @property
    def wait_cpu_seconds(self) -> float: ...

    def describe(self) -> str: ...

    def take_bytes(self) -> int: ...

    # -- point to point ------------------------------------------------------------
    def send_object(self, obj: Any, dest: int, tag: int, timeout: float | None = None) -> int: ...

    def recv_object(self, source: int = -1, tag: int = 0, timeout: float | None = None,
                    due: float | None = None) -> Received: ...

    def send_array(self, buf: np.ndarray, dest: int, tag: int = 0, timeout: float | None = None) -> None: ...

    def recv_array(self, buf: np.ndarray, source: int = -1, tag: int = 0,
                   timeout: float | None = None) -> Received: ...

    def send_large_array(self, array: np.ndarray, dest: int, tag: int = 0, timeout: float | None = None) -> None: ...

    def send_array_parts(self, parts: Iterable[np.ndarray], shape: tuple[int, ...], dtype: Any, dest: int,
                         tag: int = 0, timeout: float | None = None) -> None: ...

    def recv_large_array(self, source: int, tag: int = 0, timeout: float | None = None) -> np.ndarray: ...

    def recv_large_array_header(self, source: int, tag: int = 0,
                                timeout: float | None = None) -> IncomingArray: ...

    def recv_large_array_body(self, incoming: IncomingArray, take: Callable[[np.ndarray], None],
                              timeout: float | None = None) -> None: ...

    # -- collectives -----------------------------------------------------------------
    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None: ...

    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                   on_part: Callable[[int, int], None] | None = None) -> None: ...

    def reduce_broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None,
                         on_part: Callable[[int, int], None] | None = None, root_adds: bool = True,
                         on_returned: Callable[[int, int], None] | None = None) -> None: ...

    def gather(self, buf: np.ndarray, out: np.ndarray | None = None, root: int = 0,
               timeout: float | None = None) -> None: ...

    def bcast_object(self, obj: Any = None, root: int = 0, timeout: float | None = None) -> Any: ...

    def allgather(self, obj: Any, timeout: float | None = None) -> list[Any]: ...

    def barrier(self, timeout: float | None = None) -> None: ...

    def learn_hosts(self) -> list[str]: ...

    def node_layout(self) -> tuple[int, list[int]]: ...

    def duplicate(self, timeout: float | None = None) -> RankTransport: ...

    def split_workers(self) -> RankTransport | None: ...

    # -- failures ----------------------------------------------------------------------
    def abort(self, code: int = 1) -> None: ...

    def notify_failure(self, text: str) -> None: ...

    def check_notices(self) -> None: ...

    def shrink(self, timeout: float | None = None) -> Shrunk: ...

    def agree(self, flag: int) -> int: ...

