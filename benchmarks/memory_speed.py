"""What this machine's memory allows a round: the time of the copies and adds its bytes need at least.

A 2-worker round on one node, at best, adds each worker's state into rank 0's sum once and copies the
result once to each worker (each worker computes its contribution where rank 0 reads it). On one
thread, with every page touched before, that is ``W`` in-place adds and ``W`` copies of the round's
bytes: the memory bound a round's communication and combining are measured against.
"""

from __future__ import annotations

import statistics
import time

import numpy as np


def memory_bound(size: int, workers: int, reps: int) -> float:
    """Median seconds of ``workers`` in-place adds and ``workers`` copies of ``size`` float32 values, on one
    thread, every page touched before."""
    total, other, out = (np.ones(size, np.float32) for _ in range(3))
    spent = []
    for _ in range(reps):
        started = time.perf_counter()
        for _ in range(workers):
            np.add(total, other, out=total)
        for _ in range(workers):
            np.copyto(out, total)
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def bandwidths(size: int, reps: int) -> tuple[float, float]:
    """This machine's copy and in-place add rates over ``size`` float32 values, one thread, in GB/s of the
    array's bytes (the median of ``reps``): what a round's bytes move at, at best."""
    a, b = np.ones(size, np.float32), np.ones(size, np.float32)
    copies, adds = [], []
    for _ in range(reps):
        started = time.perf_counter()
        np.copyto(b, a)
        copies.append(time.perf_counter() - started)
        started = time.perf_counter()
        np.add(a, b, out=a)
        adds.append(time.perf_counter() - started)
    return a.nbytes / statistics.median(copies) / 1e9, a.nbytes / statistics.median(adds) / 1e9
