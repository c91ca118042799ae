"""Per-rank compute settings: how many threads a rank's Keras backend may use."""

from __future__ import annotations

import os

from mpi_trainer.launch.devices import configured_backend

# JAX's CPU client sizes its thread pool by the cores the process may use when it starts. A host callback
# inside a compiled step (synchronous SGD's per-step sum) takes its inputs through that pool while the step
# holds a thread of it: with one core, the two can wait on each other for good. Two cores suffice.
JAX_CALLBACK_CORES = 2


def threads_for_rank(rank: int, node_cores: int, node_ranks: list[int],
                     usable_cores: int | None = None, configured: int = 0) -> int:
    """Cores of the node divided by the worker ranks on it; the scheduler is not counted.

    The scheduler (rank 0) mostly waits, and evaluates while workers wait, so
    it may use every core of its node. ``usable_cores`` caps the figure when
    mpirun bound the rank to fewer cores than the node has. ``configured``
    (``train.threads``, 0 = work it out) fixes a worker's threads, e.g. on a node
    shared with other jobs.
    """
    if configured and rank != 0:
        return configured
    workers_here = sum(1 for r in node_ranks if r != 0)
    threads = node_cores if rank == 0 or workers_here == 0 else node_cores // workers_here
    if usable_cores is not None:
        threads = min(threads, usable_cores)
    return max(1, threads)


def worker_cores(rank: int, node_ranks: list[int], threads: int, allowed: list[int]) -> list[int] | None:
    """The cores a CPU worker keeps to: the i-th worker of the node takes the i-th run of ``threads``
    of the cores it may use. None (nobody binds) unless the node's workers fill those cores: when
    they do not fit side by side, and when the cores left over would hold another worker, since
    a worker left free borrows idle cores (a JAX worker at one thread keeps more than one busy).

    Two JAX workers filling two cores trained 7 % faster each on its own core than both left free
    (docs/performance.md); TensorFlow workers about 3 %.
    """
    workers = [r for r in sorted(node_ranks) if r != 0]
    spare = len(allowed) - len(workers) * threads
    if rank not in workers or threads < 1 or not 0 <= spare < threads:
        return None
    start = workers.index(rank) * threads
    return sorted(allowed)[start:start + threads]


def allowed_cores() -> list[int] | None:
    """The cores this process may run on, or None where the platform cannot say (not Linux)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return None


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return None


def configure_threads(threads: int) -> None:
    """Size the backend's thread pools; call before the backend runs its first op
    (:func:`~mpi_trainer.launch.devices.backend_started` tells when it is too late)."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    backend = configured_backend()
    if backend == "jax":
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'}"
                                   f" intra_op_parallelism_threads={threads}").strip()
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
