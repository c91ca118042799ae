"""Run under mpirun by the transport suite: mpi_trainer's transport verbs against blocking mpi4py calls.

    mpirun -n R python -m benchmarks.transport_job --payload-mb 2 [--reps 11]

On one float32 buffer, the transport's ``reduce_sum``, ``broadcast`` and
``send_array``/``recv_array`` alternate with blocking ``Reduce``, ``Bcast`` and ``Send``/``Recv``;
a call's time is the longest any rank spent in it (from a barrier), and rank 0 prints the median
milliseconds of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from mpi_trainer.comm.transport import Transport


def calls(comm: Any, transport: Transport, buf: np.ndarray) -> dict[str, Callable[[], None]]:
    """Each timed call by name: the transport's verb and the blocking mpi4py call it must match."""
    rank = comm.Get_rank()

    def blocking_reduce() -> None:
        comm.Reduce(MPI.IN_PLACE if rank == 0 else buf, buf if rank == 0 else None, op=MPI.SUM, root=0)

    def transport_p2p() -> None:
        if rank == 1:
            transport.send_array(buf, 0)
        elif rank == 0:
            transport.recv_array(buf, 1)

    def blocking_p2p() -> None:
        if rank == 1:
            comm.Send(buf, 0, 99)
        elif rank == 0:
            comm.Recv(buf, 1, 99)

    return {"reduce": lambda: transport.reduce_sum(buf), "Reduce": blocking_reduce,
            "broadcast": lambda: transport.broadcast(buf), "Bcast": lambda: comm.Bcast(buf, 0),
            "send_recv": transport_p2p, "Send_Recv": blocking_p2p}


def timed(comm: Any, call: Callable[[], None]) -> float:
    """Seconds from a common start to the last rank's return from ``call``."""
    comm.Barrier()
    started = time.perf_counter()
    call()
    return comm.allreduce(time.perf_counter() - started, op=MPI.MAX)


def times(comm: Any, transport: Transport, megabytes: float, reps: int) -> dict[str, float]:
    """Median milliseconds of each call, in alternating order (forwards, then backwards)."""
    named = calls(comm, transport, np.ones(int(megabytes * 1e6) // 4, np.float32))
    spent: dict[str, list[float]] = {name: [] for name in named}
    for rep in range(reps):
        for name in (list(named) if rep % 2 == 0 else list(reversed(named))):
            spent[name].append(timed(comm, named[name]))
    return {name: 1e3 * statistics.median(values) for name, values in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payload-mb", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=11)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    transport = Transport(comm)
    transport.bound = 600.0  # as in a job: every wait bounded, failure notices checked while it sleeps
    result = times(comm, transport, args.payload_mb, args.reps)
    if comm.Get_rank() == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
