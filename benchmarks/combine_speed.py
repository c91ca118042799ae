"""What rank 0's combine of a round costs on its own: the big MLP's state combined by meaning, checked finite and
stepped by outer Nesterov, on one thread, a MiB at a time as the sum arrives on one node, as JSON.

    python -m benchmarks.combine_speed --size 25m

The model of the ``big_models`` suite (:mod:`benchmarks.big_mlp`) with Adam, so that two thirds of the state are
moving averages; the workers' sum stands in as random values. Prints the median seconds of ``--reps`` combines
of the whole state: the arithmetic a round adds on rank 0 besides moving its bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["25m", "100m"], default="25m")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import numpy as np

    from benchmarks import big_mlp
    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
    from mpi_trainer.comm.shared_memory import CACHED_BYTES
    from mpi_trainer.trainer.scheduler import RoundCombine
    from mpi_trainer.trainer.state import ModelState, build_optimizers

    model = getattr(big_mlp, f"mlp_{args.size}")((64,), 10)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    build_optimizers(model)
    state = ModelState(model)
    outer = OuterOptimizer(OuterSettings("nesterov"), [(0, state.trainable_size)], threads=1)
    rng = np.random.default_rng(0)
    before = rng.random(state.size, dtype=np.float32)
    summed = np.empty_like(before)
    steps = np.full(state.clocks, 8, np.float32)  # 2 workers of 4 steps: every clock
    stretch = CACHED_BYTES // 4
    spent = []
    for _ in range(args.reps):
        np.multiply(before, 2, out=summed)  # the workers' sum, every page touched before
        combine = RoundCombine(state, outer, summed, before, 2.0, steps, threads=1)
        started = time.perf_counter()
        for start in range(0, state.size, stretch):
            combine.part(start, min(start + stretch, state.size))
        spent.append(time.perf_counter() - started)
    print(json.dumps({"seconds": statistics.median(spent), "values": state.size}), flush=True)


if __name__ == "__main__":
    main()
