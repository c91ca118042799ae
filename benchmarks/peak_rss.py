"""Run a module as ``python -m`` would, then write this rank's peak RSS (getrusage) into a folder.

    mpirun -n R python -m benchmarks.peak_rss DIR mpi_trainer train CONFIG ...

Each rank writes ``DIR/rank<N>.json`` with ``{"rank": N, "peak_rss_gb": ...}`` when it exits, however
it exits, so the big_models suite reads every rank's peak from one job.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import runpy
import sys
from pathlib import Path


def write_peak(folder: Path) -> None:
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # Linux counts KiB
    (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak_rss_gb": peak_gb}))


def main() -> None:
    folder, module = Path(sys.argv[1]), sys.argv[2]
    folder.mkdir(parents=True, exist_ok=True)
    atexit.register(write_peak, folder)
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
