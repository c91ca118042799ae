"""Atomic HDF5 checkpoints written by rank 0, with a backup of the previous one.

A save writes ``<name>.tmp``, flushes and fsyncs it, moves the current file to
``<name>.bak`` and renames the new one into place. A reader that finds the
latest file missing or unreadable falls back to the backup.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.run_files import backup_path, fsync_dir

FORMAT_VERSION = 1


def save_checkpoint(path: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    """Write ``arrays`` (datasets) and ``meta`` (JSON attribute) atomically to ``path``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as handle:
        for name, array in sorted(arrays.items()):
            handle.create_dataset(name, data=array)
        handle.attrs["meta"] = json.dumps(meta, sort_keys=True)
        handle.attrs["format_version"] = FORMAT_VERSION
        handle.flush()
    with tmp.open("rb+") as raw:
        os.fsync(raw.fileno())
    if path.exists():
        os.replace(path, backup_path(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _read(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with h5py.File(path, "r") as handle:
        arrays = {name: handle[name][()] for name in handle.keys()}
        meta = json.loads(handle.attrs["meta"])
    return arrays, meta


def load_checkpoint(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load ``path``, or its backup when the latest is missing or unreadable."""
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
            get_logger().warning("checkpoint %s is unreadable (%s); trying the backup", candidate, exc)
            continue
        if candidate != path:
            get_logger().warning("loaded the backup checkpoint %s", candidate)
        return result
    raise FileNotFoundError("no readable checkpoint: " + "; ".join(errors))
