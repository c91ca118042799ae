"""Passes over a model-sized vector at memory speed: in cache-sized chunks, on the threads rank 0 may use.

A NumPy expression over whole vectors writes a full-size temporary per operator and reads it back:
at 100 MB that is several passes over main memory and as many page-faulted allocations per round.
Done chunk by chunk into a few scratch buffers of :data:`CHUNK` values, the arithmetic stays in
cache and each input is read once and each output written once. The chunks are split between
threads (NumPy releases the GIL inside its loops): while rank 0 aggregates, the workers wait.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

CHUNK = 1 << 15  # values per chunk: 128 KiB of float32, so a few arrays' chunks stay in cache
MAX_THREADS = 8  # memory bandwidth, not arithmetic, bounds a pass beyond a few threads
MIN_CHUNKS_PER_THREAD = 16  # below 2 MB a thread costs more to start than it saves


def default_threads() -> int:
    """The threads rank 0's passes over the weights use: its cores (the workers wait for the result), at most
    :data:`MAX_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def in_parallel(run: Callable[[list[Any], Any], None], items: list[Any], scratch: Sequence[Any]) -> None:
    """``run(part, scratch[i])`` over contiguous parts of ``items``, one per scratch set, on threads (NumPy
    releases the GIL inside its loops); on the caller's thread when one part is enough."""
    parts = min(len(scratch), max(1, len(items) // MIN_CHUNKS_PER_THREAD))
    if parts == 1:
        run(items, scratch[0])
        return
    bounds = [len(items) * i // parts for i in range(parts + 1)]
    with ThreadPoolExecutor(parts) as pool:
        for future in [pool.submit(run, items[bounds[i]:bounds[i + 1]], scratch[i]) for i in range(parts)]:
            future.result()


def chunks(size: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of every chunk of a vector of ``size`` values."""
    for start in range(0, size, CHUNK):
        yield start, min(start + CHUNK, size)


def all_finite(vector: np.ndarray, threads: int | None = None) -> bool:
    """Whether every value of float32 ``vector`` is finite, without a full-size temporary. A chunk's sum is
    finite only when its values are (an infinity or a NaN carries into the sum), so a finite sum settles the
    chunk in one SIMD pass; a sum that is not finite may be an overflow of finite values, and the chunk's
    values are looked at one by one."""
    bad = []

    def run(part: list[tuple[int, int]], _: Any) -> None:
        for start, stop in part:
            piece = vector[start:stop]
            if not np.isfinite(np.add.reduce(piece)) and not np.isfinite(piece).all():
                bad.append(start)
                return

    in_parallel(run, list(chunks(vector.size)), [None] * max(1, threads or default_threads()))
    return not bad
