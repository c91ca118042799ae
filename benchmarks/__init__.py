"""mpi_trainer's benchmarks: one harness (:mod:`.harness`), suites grouped by question (:mod:`.suites`).

    python -m benchmarks list                                       # the suites, and which cannot run here
    python -m benchmarks run [SUITE ...] [--repeats N] [--quick]    # writes benchmarks/results/SUITE.json
    python -m benchmarks docs                                       # regenerates docs/performance.md

The programs a suite starts (plain Keras, MultiWorkerMirroredStrategy, the transport's timing job,
``mpi_trainer.fit`` with ``class_weight``) are modules of this package, run as
``python -m benchmarks.<module>``, under ``mpirun`` where they need it. ``pip install -e .[bench]``
adds what they need beyond mpi_trainer.
"""
