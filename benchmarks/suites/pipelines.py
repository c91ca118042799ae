"""Does ``mpi_trainer.fit`` on a ``tf.data`` pipeline reach accuracy as fast as on the same data as arrays?

One table: a Horovod-style ``tf.data`` pipeline and the same 4,000 real MNIST digits as arrays,
LeNet, 2 workers, seconds until the test accuracy first reaches 96 %, the two variants alternating.
The files and the race itself are :mod:`benchmarks.suites.data_inputs`'.
"""

from __future__ import annotations

from benchmarks.harness import Comparison
from benchmarks.suites import data_inputs
from benchmarks.suites.data_inputs import prepared, unavailable

__all__ = ["QUESTION", "comparisons", "prepared", "unavailable"]

QUESTION = "Pipelines: `fit` on a tf.data pipeline against the same data as arrays"


def comparisons(quick: bool) -> list[Comparison]:
    command = f"python -m benchmarks run pipelines{' --quick' if quick else ''}"
    return [data_inputs.fit_time(command, 2 if quick else 10)]
