"""What checking an ``.npz``'s CRC-32s costs: opening a file and reading every training row once, with and
without the check, side by side in one run (alternating, page cache warm for both).

    python -m benchmarks.data_checksums [--megabytes 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from mpi_trainer.data import readers


def _write(path: Path, megabytes: int) -> None:
    rows = megabytes * 2**20 // (784 * 4)
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.random((rows, 784), dtype=np.float32), y_train=rng.integers(0, 10, rows),
             x_test=rng.random((1000, 784), dtype=np.float32), y_test=rng.integers(0, 10, 1000))


def _open_and_read(path: Path) -> float:
    begun = time.perf_counter()
    raw = readers.read_npz(path)
    for start in range(0, len(raw.x), readers.READ_CHUNK_ROWS):
        np.asarray(raw.x[start:start + readers.READ_CHUNK_ROWS]).sum()
    return time.perf_counter() - begun


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "bench.npz"
        _write(path, args.megabytes)
        size = path.stat().st_size / 1e6
        _open_and_read(path)  # warm the page cache
        times: dict[str, list[float]] = {"checked": [], "unchecked": []}
        for _ in range(args.repeats):
            times["checked"].append(_open_and_read(path))
            with mock.patch.object(readers, "check_member_crc", lambda *a: None):
                times["unchecked"].append(_open_and_read(path))
    print(f"file: {size:.0f} MB (uncompressed .npz), repeats: {args.repeats}, medians:")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:>9}: {median:.3f} s, {size / median:,.0f} MB/s")
    extra = statistics.median(times["checked"]) - statistics.median(times["unchecked"])
    print(f"  the check adds {extra:.3f} s, {extra / size * 1000:.2f} ms per MB")


if __name__ == "__main__":
    main()
