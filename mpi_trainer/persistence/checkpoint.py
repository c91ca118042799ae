"""Atomic, checksummed HDF5 checkpoints written by rank 0, with a backup of the previous one.

A save writes ``<name>.tmp`` (created new, never through a link), flushes and
fsyncs it, moves the current file to ``<name>.bak``, renames the new one into
place and fsyncs the directory. Arrays are written one at a time as they are
handed over, so a checkpoint of large arrays that arrive one after another (each
worker's optimizer state) never holds them all in memory. Each dataset records a
SHA-256 of its name, dtype, shape and bytes in its ``sha256`` attribute; the file's
``sha256`` attribute is the SHA-256 of those digests (sorted by name) and the
metadata. A reader that finds the latest file missing, unreadable or not matching
its digests falls back to the backup with a warning naming the file; when neither
holds, it fails naming both. Files of format 2 (one digest over every array's
bytes) are still read and checked. A reader may leave large arrays on disk
(:func:`open_checkpoint`): their digests are checked part by part as the file is
read, and they are read again, part by part, when they are wanted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.run_files import backup_path, fsync_dir, fsync_file, prepare_new

FORMAT_VERSION = 3  # 2: one ``sha256`` over every array; 3: one per dataset, and the file's over them
READ_PART_BYTES = 16 << 20  # an array left on disk is checked and read back in parts of this size


@dataclass(frozen=True)
class StreamedArray:
    """A flat array of ``size`` values of ``dtype`` that arrives in parts: ``deliver(take)`` calls ``take``
    with each part, in order. A checkpoint writes each part as it comes (a worker's optimizer state,
    received message by message), so the whole array is never in memory."""

    size: int
    dtype: np.dtype
    deliver: Callable[[Callable[[np.ndarray], None]], None]


CheckpointArray = np.ndarray | StreamedArray


@dataclass(frozen=True)
class StoredArray:
    """A flat array of a checkpoint left on disk when the checkpoint was read (its digest checked then): read
    part by part when it is wanted, from the file as it was read (held open while this is held, so a newer
    checkpoint renamed into place does not change it)."""

    file: h5py.File
    name: str

    @property
    def size(self) -> int:
        return int(self.file[self.name].size)

    @property
    def dtype(self) -> np.dtype:
        dtype: np.dtype = np.dtype(self.file[self.name].dtype)
        return dtype

    def parts(self) -> Iterator[np.ndarray]:
        """The values in order, flat parts of :data:`READ_PART_BYTES`: one in memory at a time."""
        dataset = self.file[self.name]
        step = max(1, READ_PART_BYTES // dataset.dtype.itemsize)
        for start in range(0, dataset.size, step):
            yield np.asarray(dataset[start:start + step]).reshape(-1)

    def read(self) -> np.ndarray:
        return np.asarray(self.file[self.name][()])


class CheckpointDamaged(ValueError):
    """A checkpoint that parses but whose contents do not match the digest it records."""


def _hash_header(digest: Any, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    digest.update(f"{name}\0{dtype.str}\0{shape}\0".encode())


def _hash_array(digest: Any, name: str, array: np.ndarray) -> None:
    array = np.ascontiguousarray(array)
    _hash_header(digest, name, array.dtype, array.shape)
    digest.update(array.data.cast("B"))


def array_digest(name: str, array: np.ndarray) -> str:
    """SHA-256 of one array: its name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    _hash_array(digest, name, array)
    return digest.hexdigest()


def contents_digest(array_digests: Mapping[str, str], meta_json: str) -> str:
    """The file's SHA-256: every array's digest (sorted by name), then the metadata's JSON."""
    digest = hashlib.sha256()
    for name in sorted(array_digests):
        digest.update(f"{name}\0{array_digests[name]}\0".encode())
    digest.update(meta_json.encode())
    return digest.hexdigest()


def _format_2_digest(arrays: Mapping[str, np.ndarray], meta_json: str) -> str:
    digest = hashlib.sha256()
    for name in sorted(arrays):
        _hash_array(digest, name, arrays[name])
    digest.update(meta_json.encode())
    return digest.hexdigest()


def save_checkpoint(path: Path, arrays: Mapping[str, Any] | Iterable[tuple[str, Any]],
                    meta: dict[str, Any] | Callable[[], dict[str, Any]]) -> None:
    """Write ``arrays`` (datasets) and ``meta`` (JSON attribute) atomically to ``path``.

    ``arrays`` is a mapping or ``(name, array)`` pairs; pairs from a generator are written as it yields
    them, one held at a time, and a :class:`StreamedArray` is written part by part as it arrives.
    ``meta`` may be a function, called once every array is written (metadata that counts what their
    arrival cost)."""
    path = Path(path)
    tmp = prepare_new(path.with_name(path.name + ".tmp"))
    items = arrays.items() if isinstance(arrays, Mapping) else arrays
    digests: dict[str, str] = {}
    try:
        with h5py.File(tmp, "w") as handle:
            for name, value in items:
                if isinstance(value, StreamedArray):
                    digests[name] = _write_streamed(handle, name, value)
                else:
                    array = np.asarray(value)
                    dataset = handle.create_dataset(name, data=array)
                    digests[name] = dataset.attrs["sha256"] = array_digest(name, array)
                    del array
                del value  # the next array may be as large: this one is on its way to disk
            meta_json = json.dumps(meta() if callable(meta) else meta, sort_keys=True)
            handle.attrs["meta"] = meta_json
            handle.attrs["format_version"] = FORMAT_VERSION
            handle.attrs["sha256"] = contents_digest(digests, meta_json)
            handle.flush()
        fsync_file(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)  # an array that could not be had (a lost worker's state): no file
        raise
    if path.exists():
        os.replace(path, backup_path(path))
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _write_streamed(handle: h5py.File, name: str, value: StreamedArray) -> str:
    """One dataset filled part by part as ``value`` delivers them; returns (and records) its digest, the same
    as :func:`array_digest` of the whole array."""
    dtype = np.dtype(value.dtype)
    dataset = handle.create_dataset(name, shape=(value.size,), dtype=dtype)
    digest, written = hashlib.sha256(), 0
    _hash_header(digest, name, dtype, (value.size,))

    def take(part: np.ndarray) -> None:
        nonlocal written
        part = np.ascontiguousarray(part, dtype=dtype).reshape(-1)
        if written + part.size > value.size:
            raise ValueError(f"array {name!r} of {value.size} values was handed more")
        dataset[written:written + part.size] = part
        digest.update(part.data.cast("B"))
        written += part.size

    value.deliver(take)
    if written != value.size:
        raise ValueError(f"array {name!r} of {value.size} values was handed {written}")
    dataset.attrs["sha256"] = digest.hexdigest()
    return digest.hexdigest()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _read(path: Path, leave: Callable[[str], bool]) -> tuple[dict[str, np.ndarray], dict[str, StoredArray],
                                                             dict[str, Any]]:
    """The arrays read, the flat arrays ``leave`` left on disk (format 3) and the metadata, every digest checked."""
    handle = h5py.File(path, "r")
    try:
        meta_json = _text(handle.attrs["meta"])
        recorded = handle.attrs.get("sha256")
        version = int(handle.attrs.get("format_version", 1))
        arrays: dict[str, np.ndarray] = {}
        stored: dict[str, StoredArray] = {}
        digests: dict[str, str] = {}
        for name in handle.keys():
            if version >= 3 and leave(name) and handle[name].ndim == 1:
                stored[name] = StoredArray(handle, name)
                digests[name] = _stored_digest(stored[name])
            else:
                arrays[name] = handle[name][()]
                if version >= 3:
                    digests[name] = array_digest(name, arrays[name])
            if version >= 3 and digests[name] != _text(handle[name].attrs.get("sha256", "")):
                raise CheckpointDamaged(f"the SHA-256 of its array {name!r} is {digests[name]}, the file "
                                        f"records {_text(handle[name].attrs.get('sha256', 'none'))}")
        if recorded is not None:  # checkpoints of format 1 hold none
            recorded = _text(recorded)
            actual = contents_digest(digests, meta_json) if version >= 3 else _format_2_digest(arrays, meta_json)
            if actual != recorded:
                raise CheckpointDamaged(f"its contents' SHA-256 is {actual}, the file records {recorded}")
    except BaseException:
        handle.close()
        raise
    if not stored:
        handle.close()
    return arrays, stored, json.loads(meta_json)


def _stored_digest(stored: StoredArray) -> str:
    """:func:`array_digest` of an array left on disk, read part by part."""
    digest = hashlib.sha256()
    _hash_header(digest, stored.name, stored.dtype, (stored.size,))
    for part in stored.parts():
        digest.update(np.ascontiguousarray(part).data.cast("B"))
    return digest.hexdigest()


def load_checkpoint(path: Path, fell_back: list[str] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Load ``path``, or its backup when the latest is missing, unreadable or damaged (digest mismatch); each
    file passed over is appended to ``fell_back`` with why, as the warnings name it."""
    arrays, _, meta = open_checkpoint(path, lambda name: False, fell_back)
    return arrays, meta


def open_checkpoint(path: Path, leave: Callable[[str], bool], fell_back: list[str] | None = None
                    ) -> tuple[dict[str, np.ndarray], dict[str, StoredArray], dict[str, Any]]:
    """As :func:`load_checkpoint`, but the flat arrays whose names ``leave`` picks stay on disk as
    :class:`StoredArray` (a worker's optimizer state: read part by part when it is sent, never whole in
    memory); returns (arrays read, arrays left on disk, metadata)."""
    path = Path(path)
    errors: list[str] = []
    for candidate in (path, backup_path(path)):
        if not candidate.exists():
            errors.append(f"{candidate}: missing")
            if candidate == path and backup_path(path).exists():
                get_logger().warning("checkpoint %s is missing; trying the backup", candidate)
            continue
        try:
            result = _read(candidate, leave)
        except (OSError, KeyError, ValueError) as exc:
            errors.append(f"{candidate}: {exc}")
            what = "damaged" if isinstance(exc, CheckpointDamaged) else "unreadable"
            get_logger().warning("checkpoint %s is %s (%s); trying the backup", candidate, what, exc)
            continue
        if candidate != path:
            get_logger().warning("loaded the backup checkpoint %s", candidate)
            if fell_back is not None:
                fell_back.extend(errors)
        return result
    raise FileNotFoundError("no readable checkpoint: " + "; ".join(errors))
