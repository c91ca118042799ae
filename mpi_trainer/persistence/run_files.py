"""The run directory: its file names, and writers that never leave a file half-written.

Only rank 0 writes here. ``rounds.csv`` is appended one flushed row at a time
(a resume rewrites it from the checkpoint's rows); ``train.log`` and ``launch.log`` are appended
line by line; everything else is replaced atomically (written beside as
``<name>.tmp`` or ``<stem>.tmp.weights.h5``, synced, renamed), and a job
starting on the directory deletes such leftovers of an interrupted write.

No file here is written through a symbolic link: a new file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (a leftover of that name is unlinked first, which
removes a planted link, not what it points to), a file appended to is opened with
``O_NOFOLLOW``, and a rename replaces a link itself, never its target. Files whose
contents a job reads back (the final weights) get a ``<name>.sha256`` beside them
in ``sha256sum`` format, which the reader checks.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

ROUNDS_NAME = "rounds.csv"
SUMMARY_NAME = "summary.json"
CONFIG_NAME = "config.toml"
LOG_NAME = "train.log"
CHECKPOINT_NAME = "checkpoint.h5"
FINAL_WEIGHTS_NAME = "final.weights.h5"
FINAL_STATE_NAME = "final.state.h5"  # the final weights in the checkpoints' codec, when Keras cannot save them
FIT_PRINT_NAME = "fit.json"  # a keras.Model fit's fingerprint: what must be equal for it to resume
BACKUP_SUFFIX = ".bak"
REPORT_NAME = "report.txt"
TIMELINE_NAME = "timeline.json"
TENSORBOARD_DIR = "tensorboard"

BUILT_IN_METRICS = ("loss", "accuracy")  # their columns are always there (empty when not compiled)


def backup_path(path: Path) -> Path:
    """Where the previous good copy of ``path`` is kept while a new one is written."""
    return path.with_name(path.name + BACKUP_SUFFIX)


DIGEST_SUFFIX = ".sha256"
_CHUNK = 1 << 20


class UnsafeFileError(OSError):
    """A run-directory file is a symbolic link (or otherwise cannot be opened without following one)."""


def _refuse_link(path: Path, exc: OSError) -> UnsafeFileError:
    if exc.errno in (errno.ELOOP, errno.EMLINK):
        return UnsafeFileError(exc.errno, f"{path} is a symbolic link; mpi_trainer never writes through one. "
                                          f"Received: a link to {os.readlink(path)!r}; expected a regular "
                                          f"file (or none) there")
    return UnsafeFileError(exc.errno, f"{path}: {exc.strerror}")


def create_new(path: Path, mode: int = 0o644) -> int:
    """A new, empty regular file at ``path`` (a leftover file or link of that name is unlinked first);
    returns its descriptor, opened for writing. Never follows a link."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _refuse_link(path, exc) from None


def prepare_new(path: Path) -> Path:
    """:func:`create_new`, closed again: for writers that open by name (HDF5, Keras, matplotlib)."""
    os.close(create_new(path))
    return Path(path)


def open_append(path: Path, mode: int = 0o644) -> int:
    """``path`` opened for appending (created if missing), refused when it is a symbolic link."""
    try:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _refuse_link(Path(path), exc) from None


def open_existing_or_new(path: Path, mode: int = 0o644) -> int:
    """``path`` opened for reading and writing (created if missing), refused when it is a symbolic link."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        raise _refuse_link(Path(path), exc) from None


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + DIGEST_SUFFIX)


def verify_digest(path: Path) -> None:
    """Raise ValueError when ``path`` does not match the digest recorded beside it (none recorded: pass)."""
    recorded_file = digest_path(path)
    if not recorded_file.exists():
        return
    recorded = recorded_file.read_text(encoding="utf-8").split()[0]
    actual = file_sha256(path)
    if actual != recorded:
        raise ValueError(f"{path} is damaged: its SHA-256 is {actual}, {recorded_file.name} records {recorded}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so a reader sees the old or the new file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(create_new(tmp), "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def save_weights_atomic(model: Any, path: Path) -> None:
    """``model.save_weights(path)`` that leaves the old file or the new one, never half of one, and
    records its SHA-256 beside it (``<name>.sha256``) for :func:`verify_digest`.

    Keras wants the name to end in ``.weights.h5``, hence ``<stem>.tmp.weights.h5`` beside it.
    """
    path = Path(path)
    tmp = prepare_new(path.with_name(path.name.replace(".weights.h5", "") + ".tmp.weights.h5"))
    try:
        model.save_weights(tmp)
    except BaseException:
        tmp.unlink(missing_ok=True)  # nothing half-written left behind
        raise
    fsync_file(tmp)
    digest = file_sha256(tmp)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    write_atomic(digest_path(path), f"{digest}  {path.name}\n")


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_rounds(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))
