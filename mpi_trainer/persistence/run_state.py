"""What a run directory already holds, read before anything in it is changed.

A job started on a directory that holds a run carries that run on (as Keras'
``BackupAndRestore`` does): from its checkpoint when the run was interrupted,
not at all when the run is complete and no more rounds are asked for. Before
it resumes, the run's *fingerprint* (model architecture, data, and the
settings the weights depend on) is compared with the new job's; a mismatch is
refused, naming what differs, while every file is still as it was.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

if TYPE_CHECKING:
    from mpi_trainer.data.sources import Dataset

# what the atomic writers name a file while they write it: ``<name>.tmp``, ``<stem>.tmp.weights.h5``
TMP_SUFFIXES = (".tmp", ".tmp.weights.h5")
# stop reasons after which a larger limit lets the run go on; the others end it for good
EXTENDABLE_STOPS = ("epochs", "max_steps")


def model_fingerprint(model: Any) -> dict[str, Any]:
    """Layer kinds and weight shapes (not layer names, which Keras numbers per process)."""
    layers = [type(layer).__name__ for layer in model.layers]
    shapes = [list(np.shape(w)) for w in model.get_weights()]
    digest = hashlib.sha256(json.dumps([layers, shapes]).encode()).hexdigest()[:16]
    return {"layers": ",".join(layers), "parameters": int(sum(int(np.prod(s)) for s in shapes)),
            "architecture": digest}


def labels_checksum(*arrays: np.ndarray) -> str:
    crc = 0
    for array in arrays:
        crc = zlib.crc32(np.ascontiguousarray(array).tobytes(), crc)
    return f"{crc:08x}"


def data_fingerprint(source: str, dataset: Dataset) -> dict[str, Any]:
    """The data's path, its size on disk, its split sizes and a checksum of every label.

    An input that holds no label arrays (a pipeline such as a ``tf.data.Dataset``) has None
    for what it cannot tell; None is then compared like any other value."""
    path = Path(source)
    rows: list[int] | None
    try:
        rows = [int(dataset.num_train), len(dataset.y_val), len(dataset.y_test)]
        checksum = labels_checksum(dataset.y_train, np.asarray(dataset.y_val), np.asarray(dataset.y_test))
    except (AttributeError, TypeError, NotImplementedError):
        rows = checksum = None
    return {"data_source": source, "data_file_bytes": path.stat().st_size if path.is_file() else None,
            "data_rows": rows, "data_labels_crc32": checksum}


def fingerprint(source: str, dataset: Dataset, model: Any) -> dict[str, Any]:
    return {**data_fingerprint(source, dataset), **model_fingerprint(model)}


FINGERPRINT_MEANING = {
    "data_source": "the data's path", "data_file_bytes": "the data file's size in bytes",
    "data_rows": "the train/validation/test row counts", "data_labels_crc32": "the labels' checksum",
    "layers": "the model's layers", "parameters": "the model's parameter count",
    "architecture": "the model's architecture (layer kinds and weight shapes)",
}


def is_complete(summary: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    return bool(summary and summary.get("completed"))


def more_to_train(summary: Mapping[str, Any], epochs: int, max_steps: int) -> bool:
    """Whether a complete run goes on under these limits: only one that ended on a limit now raised
    (an early stop, a NaN stop or a callback's stop ends it for good)."""
    if summary.get("stop_reason") not in EXTENDABLE_STOPS:
        return False
    more_rounds = epochs > int(summary.get("rounds_completed") or 0)
    return more_rounds and (not max_steps or max_steps > int(summary.get("steps") or 0))


