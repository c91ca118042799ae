"""Atomic, checksummed HDF5 checkpoints written by rank 0, with a backup of the previous one.

A save writes ``<name>.tmp`` (created new, never through a link), flushes and
fsyncs it, moves the current file to ``<name>.bak``, renames the new one into
place and fsyncs the directory. Each file records a SHA-256 of its contents (every
array's name, dtype, shape and bytes, then the metadata) in its ``sha256``
attribute. A reader that finds the latest file missing, unreadable or not matching
its digest falls back to the backup with a warning naming the file; when neither
holds, it fails naming both.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.run_files import backup_path, fsync_dir, fsync_file, prepare_new

FORMAT_VERSION = 2  # 2: the ``sha256`` attribute


class CheckpointDamaged(ValueError):
    """A checkpoint that parses but whose contents do not match the digest it records."""


def contents_digest(arrays: dict[str, np.ndarray], meta_json: str) -> str:
    """SHA-256 over every array (sorted by name: name, dtype, shape, bytes), then the metadata's JSON."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(array.data.cast("B"))
    digest.update(meta_json.encode())
    return digest.hexdigest()


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write ``arrays`` (datasets) and ``meta`` (JSON attribute) atomically to ``path``."""
    path = Path(path)
    tmp = prepare_new(path.with_name(path.name + ".tmp"))
    arrays = {name: np.asarray(array) for name, array in arrays.items()}
    meta_json = json.dumps(meta, sort_keys=True)
    with h5py.File(tmp, "w") as handle:
        for name, array in sorted(arrays.items()):
            handle.create_dataset(name, data=array)
        handle.attrs["meta"] = meta_json
        handle.attrs["format_version"] = FORMAT_VERSION
        handle.attrs["sha256"] = contents_digest(arrays, meta_json)
        handle.flush()
    fsync_file(tmp)
    if path.exists():
        os.replace(path, backup_path(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with h5py.File(path, "r") as handle:
        arrays = {name: handle[name][()] for name in handle.keys()}
        meta_json = handle.attrs["meta"]
        recorded = handle.attrs.get("sha256")
    meta_json = meta_json.decode() if isinstance(meta_json, bytes) else str(meta_json)
    if recorded is not None:  # checkpoints of format 1 hold none
        recorded = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
        actual = contents_digest(arrays, meta_json)
        if actual != recorded:
            raise CheckpointDamaged(f"its contents' SHA-256 is {actual}, the file records {recorded}")
    return arrays, json.loads(meta_json)


def load_checkpoint(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load ``path``, or its backup when the latest is missing, unreadable or damaged (digest mismatch)."""
    path = Path(path)
    errors = []
    for candidate in (path, backup_path(path)):
        if not candidate.exists():
            errors.append(f"{candidate}: missing")
            continue
        try:
            result = _read(candidate)
        except (OSError, KeyError, ValueError) as exc:
            errors.append(f"{candidate}: {exc}")
            what = "damaged" if isinstance(exc, CheckpointDamaged) else "unreadable"
            get_logger().warning("checkpoint %s is %s (%s); trying the backup", candidate, what, exc)
            continue
        if candidate != path:
            get_logger().warning("loaded the backup checkpoint %s", candidate)
        return result
    raise FileNotFoundError("no readable checkpoint: " + "; ".join(errors))
