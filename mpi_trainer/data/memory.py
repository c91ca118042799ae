"""``data.stream = "auto"``: whether a worker reads its block into memory or streams it from disk.

Read whole, a worker holds its block as float32 features (a uint8 image file grows four times in
memory). A file whose block would take more than :data:`SHARE_OF_MEMORY` of what one rank on
this node may use is streamed instead (``data.stream = true``'s path: batches read from disk), so
a file that does not fit is never learnt of from the kernel's OOM killer. Only files that can be
streamed (HDF5, an uncompressed ``.npz``) are considered; everything else is read as before.

The estimate needs no data read: the arrays' shapes and dtypes from the file's headers, and the
memory from ``/proc/meminfo`` and the cgroup's limit. Every rank decides, and the job streams
when any rank would not fit its block (the splits differ between the two paths, so all ranks
must take the same one).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpi_trainer.config.choices import STREAM_SUFFIXES
from mpi_trainer.data.readers import read_npy_header

SHARE_OF_MEMORY = 0.5  # a block may take this share of a rank's memory before the job streams
FLOAT_BYTES = 4  # features are held as float32 when read whole


@dataclass(frozen=True)
class StreamDecision:
    """What ``data.stream = "auto"`` chose on one rank, and why."""

    stream: bool
    block_bytes: int | None  # a worker's block in memory (None: the source is not a streamable file)
    budget_bytes: int  # what the block may take on this rank

    def describe(self) -> str:
        if self.block_bytes is None:
            return "data.stream = auto: read whole (the source is not an HDF5 or .npz file)"
        verb = "streamed from disk" if self.stream else "read whole"
        relation = "more" if self.stream else "no more"
        return (f"data.stream = auto: {verb} (a worker's block takes about {self.block_bytes / 2**20:,.0f} MiB in "
                f"memory, {relation} than {SHARE_OF_MEMORY:.0%} of the {self.budget_bytes / 2**20:,.0f} MiB a rank may "
                f"use here; set data.stream = true or false to choose)")


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _cgroup_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def available_bytes() -> int:
    """The memory this node can give, the smaller of what is free and the cgroup's limit."""
    found = [value for value in (_meminfo_available(), _cgroup_limit()) if value]
    if not found:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return int(pages * size)
    return min(found)


def _npz_feature_elements(path: Path) -> int:
    """Elements of the feature arrays (``x``, ``x_train``, ``x_test``...) from the members' headers."""
    total = 0
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
            if name.startswith("x") and info.compress_type != zipfile.ZIP_STORED:
                raise ValueError("compressed members are read whole")  # streaming needs them stored
            if name.startswith("x"):
                with archive.open(info) as member:
                    shape, _, _ = read_npy_header(member)
                total += int(np.prod(shape))
    return total


def _h5_feature_elements(path: Path) -> int:
    import h5py

    with h5py.File(path, "r") as handle:
        return sum(int(np.prod(item.shape)) for name, item in handle.items()
                   if isinstance(item, h5py.Dataset) and name.startswith("x"))


def block_bytes(source: str, workers: int) -> int | None:
    """A worker's block of ``source`` in memory as float32, or None when the source cannot be streamed."""
    path = Path(source).expanduser()
    if path.suffix.lower() not in STREAM_SUFFIXES or not path.is_file():
        return None
    try:
        elements = _npz_feature_elements(path) if path.suffix.lower() == ".npz" else _h5_feature_elements(path)
    except (OSError, ValueError, zipfile.BadZipFile):
        return None  # the reader names what is wrong with the file
    return elements * FLOAT_BYTES // max(1, workers)


def decide(source: str, workers: int, ranks_on_node: int) -> StreamDecision:
    """This rank's choice for ``data.stream = "auto"``."""
    budget = available_bytes() // max(1, ranks_on_node)
    size = block_bytes(source, workers)
    return StreamDecision(size is not None and size > SHARE_OF_MEMORY * budget, size, budget)
