"""One node's round of weights: the transport through shared memory against MPI and against what memory allows.

    mpirun -n 3 --oversubscribe --bind-to none python -m benchmarks.shared_memory [--params 25e6 100e6] [--reps 5]

For each model size, on one float32 buffer per rank: the workers' buffers summed into rank 0's, then rank 0's
broadcast to them (a plain-averaging round's communication and combining). Timed side by side in one run,
alternating: blocking ``Reduce`` + ``Bcast`` (the MPI floor), the transport's ``reduce_sum`` + ``broadcast``
through MPI (``MPI_TRAINER_SHARED_MEMORY=0``), and the same through the node's shared memory (the default on
one node), the transport's ``reduce_broadcast`` (the sum and the result's return in one pass, as a round with
a float32 wire moves its state), and one copy sent from rank 1 to rank 0 and back with blocking
``Send``/``Recv`` and both ways at once with ``Isend``/``Irecv`` (what the path between them carries). A
call's time is the slowest rank's, from a barrier; the median of the repetitions is printed. The memory bound
is measured on this machine in the same run: rank 0 alone, one thread, does what the round's bytes need at
least, ``W`` in-place adds of a worker's buffer into its own and ``W`` copies of the result (one add per
worker, one copy per worker: :func:`benchmarks.memory_speed.memory_bound`). Rank 0 prints one JSON line per
size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.memory_speed import memory_bound
from mpi_trainer.comm.failures import prepare_mpi_environment

prepare_mpi_environment()  # before MPI starts: the settings a job's transport starts MPI with

from mpi4py import MPI  # noqa: E402 - after the environment above

from mpi_trainer.comm.shared_memory import ENV  # noqa: E402
from mpi_trainer.comm.transport import Transport  # noqa: E402


def timed(comm: Any, call: Callable[[], None]) -> float:
    """Seconds from a common start to the last rank's return from ``call``."""
    comm.Barrier()
    started = time.perf_counter()
    call()
    return float(comm.allreduce(time.perf_counter() - started, op=MPI.MAX))


def round_calls(comm: Any, transport: Transport, buf: np.ndarray) -> dict[str, Callable[[], None]]:
    rank = comm.Get_rank()

    def floor() -> None:
        comm.Reduce(MPI.IN_PLACE if rank == 0 else buf, buf if rank == 0 else None, op=MPI.SUM, root=0)
        comm.Bcast(buf, 0)

    def through(shared: bool) -> Callable[[], None]:
        def call() -> None:
            os.environ[ENV] = "1" if shared else "0"
            transport.reduce_sum(buf)
            transport.broadcast(buf)
        return call

    def one_pass() -> None:  # the round's path for a float32 wire: the result returns as the sum comes in
        os.environ[ENV] = "1"
        transport.reduce_broadcast(buf)

    def send_each_way() -> None:  # one copy of the buffer from rank 1 to rank 0 and back: what the path carries
        if rank == 1:
            comm.Send(buf, 0, 77)
            comm.Recv(buf, 0, 78)
        elif rank == 0:
            comm.Recv(buf, 1, 77)
            comm.Send(buf, 1, 78)

    def both_ways_at_once() -> None:  # one copy each way between ranks 0 and 1 at the same time
        if rank < 2:
            MPI.Request.Waitall([comm.Isend(buf, 1 - rank, 79), comm.Irecv(spare, 1 - rank, 79)])

    spare = np.empty_like(buf) if rank < 2 else buf
    return {"mpi_floor": floor, "transport_mpi": through(False), "transport_shared": through(True),
            "one_pass": one_pass, "send_each_way": send_each_way, "both_ways": both_ways_at_once}


def measure(comm: Any, transport: Transport, params: int, reps: int) -> dict[str, float]:
    buf = np.ones(params, np.float32)
    calls = round_calls(comm, transport, buf)
    calls["transport_shared"]()  # the window's pages and the buffers touched once before timing
    spent: dict[str, list[float]] = {name: [] for name in calls}
    for rep in range(reps):
        for name in (list(calls) if rep % 2 == 0 else list(reversed(calls))):
            spent[name].append(timed(comm, calls[name]))
    result = {name: statistics.median(values) for name, values in spent.items()}
    comm.Barrier()
    bound = memory_bound(params, comm.Get_size() - 1, reps) if comm.Get_rank() == 0 else 0.0
    comm.Barrier()
    result["memory_bound"] = bound
    if comm.Get_rank() == 0:
        result.update(params=float(params), megabytes=params * 4 / 1e6,
                      shared_over_bound=result["transport_shared"] / bound,
                      shared_over_floor=result["transport_shared"] / result["mpi_floor"],
                      one_pass_over_bound=result["one_pass"] / bound,
                      one_pass_over_floor=result["one_pass"] / result["mpi_floor"],
                      mpi_over_floor=result["transport_mpi"] / result["mpi_floor"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, nargs="+", default=[25e6, 100e6])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    transport = Transport(comm)
    transport.bound = 600.0  # as in a job: every wait bounded, failure notices checked while it sleeps
    for params in args.params:
        result = measure(comm, transport, int(params), args.reps)
        if comm.Get_rank() == 0:
            print(json.dumps({key: round(value, 4) for key, value in result.items()}), flush=True)


if __name__ == "__main__":
    main()
