"""The transport contract: the same exchanges, run through the MPI and the in-process transport.

:func:`exchange` runs on every rank of a world of any size >= 2 and returns what that rank saw;
:func:`expected` is what every transport must produce, worked out from the rank and the size alone.
``tests/unit/comm/test_transport_contract.py`` runs it on the in-process transport and
``tests/mpirun/contract_job.py`` under ``mpirun -n 3`` on the MPI one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_trainer.comm.interface import REDUCE_PART_BYTES

N = 50_000  # float32 elements: 200 kB, above the size from which the MPI transport announces a payload
TIMEOUT = 60.0
LONG = 3 * REDUCE_PART_BYTES // 4 + 7  # float32 elements of a sum that arrives in 4 parts


def exchange(transport: Any) -> dict[str, Any]:
    """Every verb once; values whose float32 sums are exact, so any transport must match to the bit."""
    rank, size = transport.rank, transport.size
    pattern = (np.arange(N) % 1000).astype(np.float32)
    seen: dict[str, Any] = {}
    weights = pattern + 0.5 if rank == 0 else np.zeros(N, np.float32)
    transport.broadcast(weights, timeout=TIMEOUT)
    seen["broadcast"] = bool(np.array_equal(weights, pattern + 0.5))
    seen["broadcast_bytes"] = transport.take_bytes()
    summed = pattern * (rank + 1)
    transport.reduce_sum(summed, timeout=TIMEOUT)
    seen["reduce_bytes"] = transport.take_bytes()
    # a sum of several parts (the parts' boundaries must not show in it)
    # and told at the root as each part is complete, in order, while later parts are still to come
    long = (np.arange(LONG) % 1000).astype(np.float32) * (rank + 1)
    whole = (np.arange(LONG) % 1000).astype(np.float32) * (size * (size + 1) // 2)
    told: list[tuple[int, int, bool]] = []
    transport.reduce_sum(long, timeout=TIMEOUT, on_part=lambda start, stop: told.append(
        (start, stop, bool(np.array_equal(long[start:stop], whole[start:stop])))))
    if rank == 0:
        seen["reduce_parts"] = bool(np.array_equal(long, whole))
        seen["parts_told"] = bool(told and told[0][0] == 0 and told[-1][1] == LONG and all(
            done for _, _, done in told) and all(a[1] == b[0] for a, b in zip(told, told[1:])))
    else:
        seen["parts_told"] = told == []
    transport.take_bytes()
    # a sum whose result, as the root's on_part leaves each part, comes back to every rank in the same pass
    returned = (np.arange(LONG) % 1000).astype(np.float32) * (rank + 1)
    told = []

    def less_one(start: int, stop: int) -> None:
        told.append((start, stop))
        returned[start:stop] -= 1

    arrived: list[tuple[int, int, bool]] = []  # at the other ranks: each part of the result, whole when told

    def landed(start: int, stop: int) -> None:
        arrived.append((start, stop, bool(np.array_equal(returned[start:stop], whole[start:stop] - 1))))

    transport.reduce_broadcast(returned, timeout=TIMEOUT, on_part=less_one, on_returned=landed)
    seen["returned"] = bool(np.array_equal(returned, whole - 1))
    seen["returned_bytes"] = transport.take_bytes()
    seen["returned_told"] = bool(told and told[0][0] == 0 and told[-1][1] == LONG and all(
        a[1] == b[0] for a, b in zip(told, told[1:]))) if rank == 0 else told == []
    seen["returned_arrived"] = arrived == [] if rank == 0 else bool(
        arrived and arrived[0][0] == 0 and arrived[-1][1] == LONG and all(done for _, _, done in arrived)
        and all(a[1] == b[0] for a, b in zip(arrived, arrived[1:])))
    # a sum the root takes without adding (or reading) its own buffer: the others' sum
    counting = (np.arange(LONG) % 1000).astype(np.float32)
    others = np.full(LONG, np.nan, np.float32) if rank == 0 else counting * rank
    transport.reduce_broadcast(others, timeout=TIMEOUT, root_adds=False)
    seen["others"] = bool(np.array_equal(others, counting * (size * (size - 1) // 2)))
    transport.take_bytes()
    rows = np.zeros((size, 4), np.float32) if rank == 0 else None
    transport.gather(np.full(4, rank, np.float32), rows, timeout=TIMEOUT)
    seen["bcast_object"] = transport.bcast_object({"plan": [1, 2]} if rank == 0 else None, timeout=TIMEOUT)
    seen["allgather"] = transport.allgather(f"rank {rank}", timeout=TIMEOUT)
    if rank == 0:
        seen["reduce"] = bool(np.array_equal(summed, pattern * (size * (size + 1) // 2)))
        seen["gather"] = rows[:, 0].tolist()
        seen["reports"] = sorted(_collect_reports(transport, size))
    else:
        transport.send_object({"from": rank}, 0, tag=7, timeout=TIMEOUT)
        transport.send_array(pattern * rank, 0, tag=8, timeout=TIMEOUT)
        # one array sent part by part (a worker's optimizer state): it arrives whole
        parts = (part for part in np.array_split(pattern - rank, 3))
        transport.send_array_parts(parts, (N // 2, 2), np.float32, 0, tag=9, timeout=TIMEOUT)
    transport.take_bytes()
    transport.barrier(timeout=TIMEOUT)
    return seen


def _collect_reports(transport: Any, size: int) -> list[tuple[int, int, bool, bool]]:
    """Rank 0: one object and two arrays from every worker, in whatever order they come."""
    found = []
    pattern = (np.arange(N) % 1000).astype(np.float32)
    for _ in range(size - 1):
        message = transport.recv_object(tag=7, timeout=TIMEOUT)
        array = transport.recv_array(np.empty(N, np.float32), source=message.source, tag=8, timeout=TIMEOUT)
        whole = _receive_in_parts(transport, message.source)
        found.append((message.source, message.payload["from"],
                      bool(np.array_equal(array.payload, pattern * message.source)),
                      bool(np.array_equal(whole, (pattern - message.source).reshape(N // 2, 2)))))
    return found


def _receive_in_parts(transport: Any, source: int) -> np.ndarray:
    """An array received message by message (the transport may reuse its buffer: each part is copied)."""
    incoming, parts = transport.recv_large_array_header(source, tag=9, timeout=TIMEOUT), []
    transport.recv_large_array_body(incoming, lambda part: parts.append(part.copy()), timeout=TIMEOUT)
    return np.concatenate(parts).reshape(incoming.shape)


def expected(rank: int, size: int) -> dict[str, Any]:
    """What ``rank`` of a ``size``-rank world must see, whatever carries the bytes."""
    weights_bytes = N * 4
    seen: dict[str, Any] = {
        "broadcast": True,
        # the root counts what it sends to every other rank; a rank that only receives counts nothing
        "broadcast_bytes": weights_bytes * (size - 1) if rank == 0 else 0,
        # the root receives the sum; every other rank counts its own contribution
        "reduce_bytes": 0 if rank == 0 else weights_bytes,
        "bcast_object": {"plan": [1, 2]},
        "allgather": [f"rank {r}" for r in range(size)],
        "parts_told": True,  # the root is told of every part of a sum, complete and in order; the others never
        "returned": True,  # every rank holds the root's result, each part as on_part left it
        # the root counts its result sent to every other rank; the others their contributions
        "returned_bytes": LONG * 4 * (size - 1) if rank == 0 else LONG * 4,
        "returned_told": True,
        "returned_arrived": True,  # the other ranks are told of each part of the result once it is in, in order
        "others": True,  # with root_adds False every rank holds the other ranks' sum, the root's own left out
    }
    if rank == 0:
        seen.update(reduce=True, reduce_parts=True, gather=[float(r) for r in range(size)],
                    reports=[(r, r, True, True) for r in range(1, size)])
    return seen
