"""mpi_trainer's benchmarks: one harness (:mod:`.harness`), suites grouped by question (:mod:`.suites`).

    python -m benchmarks list
    python -m benchmarks run [SUITE ...] [--repeats N] [--quick]    # writes benchmarks/results/SUITE.json
    python -m benchmarks docs                                       # regenerates docs/performance.md

Larger studies that need more than one node's worth of setup (simulated hosts, GPUs, real MNIST)
are still scripts in ``scripts/bench_*.py``; their figures are carried in ``benchmarks/results``
with the commit they were measured at.
"""
