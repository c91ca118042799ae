"""Who may own a run directory: the user running the job, as OpenSSH insists for ``~/.ssh``.

A job writes its checkpoints, logs and weights into the run directory and later
trusts what it reads back there. A directory someone else owns, or one that others
can rename or replace, could therefore make the job write where that person chose
(a root job following another user's link into a root-only directory) or feed it
files of theirs. So before the job takes its lock, the directory is refused when:

* it is not owned by the running user (the message names its owner);
* it, or any component of the path to it, is a symbolic link owned by someone
  other than the running user or root;
* it, or any directory above it, is writable by others without the sticky bit
  (anyone could rename it away and put their own in its place; ``/tmp``, with the
  sticky bit, is fine).

A directory that does not exist yet is checked through its nearest existing parent
(the job creates it, so it is then the job's own). Inside the directory, no file is
written or read through a symbolic link: a link among its entries (a ``run.lock`` or
``train.log`` pointing elsewhere) is refused, naming it and its target, before the
job touches anything.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from mpi_trainer.errors import ConfigError


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _refuse(run_dir: Path, problem: str, expected: str) -> ConfigError:
    return ConfigError(f"Refusing the run directory {str(run_dir)!r}: {problem}. Received: run_dir="
                       f"{str(run_dir)!r}; expected {expected} (or choose another run directory)")


def _check_links(run_dir: Path, absolute: Path, uid: int) -> None:
    """No component of the path as given is someone else's symbolic link."""
    for component in [*reversed(absolute.parents), absolute]:
        try:
            info = os.lstat(component)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(info.st_mode) and info.st_uid not in (uid, 0):
            raise _refuse(run_dir, f"{component} is a symbolic link owned by {owner_name(info.st_uid)} "
                                   f"(to {os.readlink(component)!r})",
                          f"a path without links of other users, as {owner_name(uid)} runs this job")


def _check_entries(run_dir: Path, resolved: Path) -> None:
    """No entry of the run directory is a symbolic link (the job would write or read through it)."""
    links = sorted(entry for entry in resolved.iterdir() if entry.is_symlink())
    if links:
        named = ", ".join(f"{link.name} -> {os.readlink(link)!r}" for link in links)
        raise _refuse(run_dir, f"it holds symbolic links: {named}; mpi_trainer never writes through one",
                      "regular files only (remove the links)")


def _others_may_replace(info: os.stat_result) -> bool:
    return bool(info.st_mode & stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX


def check_run_dir_owner(run_dir: Path, uid: int | None = None) -> None:
    """Raise ConfigError unless ``run_dir`` is (or will be) the running user's alone; see the module doc."""
    uid = os.geteuid() if uid is None else uid
    run_dir = Path(run_dir)
    absolute = Path(os.path.abspath(run_dir))
    _check_links(run_dir, absolute, uid)
    resolved = absolute.resolve()
    existing = resolved
    while not existing.exists():
        existing = existing.parent
    if existing == resolved and resolved.is_dir():
        info = os.stat(resolved)
        if info.st_uid != uid:
            raise _refuse(run_dir, f"it is owned by {owner_name(info.st_uid)} (mode {stat.filemode(info.st_mode)})",
                          f"a directory owned by {owner_name(uid)}, who runs this job")
        _check_entries(run_dir, resolved)
    for directory in [existing, *existing.parents]:
        info = os.stat(directory)
        if _others_may_replace(info):
            raise _refuse(run_dir, f"{directory} (owned by {owner_name(info.st_uid)}, mode "
                                   f"{stat.filemode(info.st_mode)}) is writable by others without the sticky bit",
                          "a directory that only its owner can write, or one with the sticky bit (chmod o-w or "
                          "chmod +t)")
