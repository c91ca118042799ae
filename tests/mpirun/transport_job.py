"""The program that test_mpirun_transport.py runs under ``mpirun -n 3``; rank 0 prints one JSON line.

    python tests/mpirun/transport_job.py exact | late | timeout | rounds
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from mpi_trainer.comm.transport import Transport, TransportTimeout

MB2 = 500_000  # float32 elements in 2 MB


def exact(transport: Transport) -> dict:
    """Every bulk verb at 2 MB, with values whose float32 sums are exact."""
    rank, comm = transport.rank, transport.comm
    pattern = (np.arange(MB2) % 1000).astype(np.float32)
    summed = pattern * (rank + 1)
    transport.reduce_sum(summed, timeout=30)
    weights = pattern + 0.5 if rank == 0 else np.zeros(MB2, np.float32)
    transport.broadcast(weights, timeout=30)
    if rank == 2:
        transport.send_array(pattern * 7, 0)
    checks = {"broadcast": bool(np.array_equal(weights, pattern + 0.5))}
    if rank == 0:
        checks["reduce"] = bool(np.array_equal(summed, pattern * 6))  # 1 + 2 + 3
        checks["send_array"] = bool(np.array_equal(transport.recv_array(np.empty(MB2, np.float32)).payload,
                                                   pattern * 7))
    checks["bytes"] = transport.take_bytes()
    return {f"rank {r}": c for r, c in enumerate(comm.gather(checks, root=0) or [])}


def measured(transport: Transport, call) -> dict:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    call()
    return {"wall": time.perf_counter() - wall0, "cpu": time.process_time() - cpu0}


def late(transport: Transport) -> dict:
    """Rank 2 comes 1 s late to a reduction and to a send; ranks 0 and 1 wait for it."""
    rank, buf = transport.rank, np.ones(MB2, np.float32)
    transport.comm.Barrier()
    if rank == 2:
        time.sleep(1.0)
    result = {"reduce": measured(transport, lambda: transport.reduce_sum(buf))}
    transport.comm.Barrier()
    if rank == 2:
        time.sleep(1.0)
        transport.send_array(buf, 0)
    elif rank == 0:
        result["recv_array"] = measured(transport, lambda: transport.recv_array(buf, 2))
    return {f"rank {r}": m for r, m in enumerate(transport.comm.gather(result, root=0) or [])}


def timeout(transport: Transport) -> dict:
    """Rank 2 never arrives: rank 0 (like the scheduler, the only rank with a watchdog) gives up after 1 s."""
    if transport.rank == 2:
        time.sleep(300)
    try:
        transport.reduce_sum(np.ones(MB2, np.float32), timeout=1.0 if transport.rank == 0 else None)
    except TransportTimeout as exc:
        print(json.dumps({"error": str(exc), "missing": exc.missing}), flush=True)
        transport.abort(3)
    return {"error": None}


ROUND_VALUES = 4_000_000  # 16 MB of float32: a round's weights
ROUNDS = 3


def rounds(transport: Transport) -> dict:
    """A plain-averaging round's traffic, three times: every rank's 16 MB summed into rank 0, then rank 0's
    broadcast; the second time in one pass (``reduce_broadcast``, rank 0 changing each part of the sum as it
    is complete); exact on every rank."""
    pattern = (np.arange(ROUND_VALUES) % 1000).astype(np.float32)
    exact_every_time = True
    for round_ in range(ROUNDS):
        weights = pattern * (transport.rank + 1)
        expected = pattern * (transport.size * (transport.size + 1) // 2)
        if round_ == 1:
            def less_one(start: int, stop: int, weights: np.ndarray = weights) -> None:
                weights[start:stop] -= 1

            transport.reduce_broadcast(weights, timeout=120, on_part=less_one)
            expected -= 1
        else:
            transport.reduce_sum(weights, timeout=120)
            if transport.rank != 0:
                weights[:] = -1
            transport.broadcast(weights, timeout=120)
        exact_every_time &= bool(np.array_equal(weights, expected))
    return {"exact": all(transport.comm.allgather(exact_every_time)), "bytes": ROUND_VALUES * 4, "rounds": ROUNDS}


def main() -> None:
    transport = Transport(MPI.COMM_WORLD)
    result = {"exact": exact, "late": late, "timeout": timeout, "rounds": rounds}[sys.argv[1]](transport)
    if transport.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
