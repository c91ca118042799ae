"""The transport contract (tests/transport_contract.py) on the MPI transport; rank 0 prints one JSON line.

    mpirun -n 3 python tests/mpirun/contract_job.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for the contract module

from transport_contract import exchange  # noqa: E402

from mpi_trainer.comm.transport import Transport  # noqa: E402


def main() -> None:
    transport = Transport(MPI.COMM_WORLD)
    seen = MPI.COMM_WORLD.gather(exchange(transport), root=0)
    if transport.rank == 0:
        print(json.dumps({"size": transport.size, "seen": seen}), flush=True)


if __name__ == "__main__":
    main()
