"""The transport contract (tests/transport_contract.py) on the MPI transport; rank 0 prints one JSON line.

    mpirun -n 3 python tests/mpirun/contract_job.py

First, what a 64 MB sum-reduction costs each rank in memory: Open MPI's ``Reduce`` of a whole message
holds a temporary copy of it at the root and at inner ranks of its tree, so the transport reduces in parts.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the contract module

from transport_contract import exchange  # noqa: E402

from mpi_trainer.comm.transport import Transport  # noqa: E402


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reduction_cost(transport: Transport) -> dict[str, float | bool]:
    """How many MB a 64 MB sum-reduction added to this rank's peak RSS, and whether the root's sum is exact."""
    values = np.ones(16 << 20, np.float32)  # written: resident before the peak is read
    before = peak_mb()
    transport.reduce_sum(values, timeout=60.0)
    grown = peak_mb() - before
    exact = bool((values == (transport.size if transport.rank == 0 else 1)).all())
    transport.take_bytes()  # the contract counts its own exchanges' bytes
    return {"peak_grown_mb": grown, "exact": exact}


def main() -> None:
    transport = Transport(MPI.COMM_WORLD)
    costs = MPI.COMM_WORLD.gather(reduction_cost(transport), root=0)
    seen = MPI.COMM_WORLD.gather(exchange(transport), root=0)
    if transport.rank == 0:
        print(json.dumps({"size": transport.size, "seen": seen, "reduction": costs}), flush=True)


if __name__ == "__main__":
    main()
