"""One writer per run directory: an exclusive ``flock`` on ``run.lock`` held while a job runs.

Rank 0 of a job takes the lock before it reads or writes anything else in the
directory; ``mpi-trainer launch`` takes it for the whole supervised run and
tells its jobs so (``MPI_TRAINER_LAUNCHER`` = the launcher's ``host:pid``), so
that their rank 0 works under the launcher's lock instead of being refused by it.
A second job, or a ``--resume`` into a directory whose job still runs, fails at
once with the holder's host and pid.

The kernel drops a ``flock`` when its holder exits, however it exits: a killed job
leaves no stale lock, only a stale note. The note (``{"host", "pid", "since"}``)
is rewritten in place by each new holder; replacing the file would hand a second
job a fresh, unlocked inode.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from mpi_trainer.errors import ConfigError
from mpi_trainer.persistence.run_dir_owner import check_run_dir_owner
from mpi_trainer.persistence.run_files import UnsafeFileError, open_existing_or_new

LOCK_NAME = "run.lock"
LAUNCHER_ENV = "MPI_TRAINER_LAUNCHER"  # host:pid of the launcher that holds the lock for this job
NOTE_WAIT_SECONDS = 1.0  # how long to wait for a new holder to write its note


class RunDirBusy(ConfigError):
    """Another job holds the run directory."""


def holder_id(host: str | None = None, pid: int | None = None) -> str:
    return f"{host or socket.gethostname()}:{pid or os.getpid()}"


class RunLock:
    """``acquire()`` the directory's lock (creating the directory), ``release()`` it at the end."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self._fd: int | None = None
        self.made_dir = False  # this job created the directory (then a refused job leaves none behind)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, allowed_holder: str | None = None) -> RunLock:
        """Take the lock, or pass when ``allowed_holder`` (``host:pid``) holds it; else raise RunDirBusy."""
        check_run_dir_owner(self.run_dir)  # before anything is created or read there
        try:
            self.made_dir = not self.run_dir.exists()
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = open_existing_or_new(self.path)
        except UnsafeFileError as exc:
            raise ConfigError(f"Cannot use the run directory {str(self.run_dir)!r}: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"Cannot use the run directory {str(self.run_dir)!r}: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.holder()
            if allowed_holder and holder and holder_id(holder.get("host"), holder.get("pid")) == allowed_holder:
                return self  # the launcher supervising this job holds it
            raise self.busy(holder) from None
        self._fd = fd
        self._write_note(fd)
        return self

    @staticmethod
    def _write_note(fd: int) -> None:
        note = json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
        os.fsync(fd)

    def holder(self) -> dict[str, Any] | None:
        """The note of whoever holds the lock (None when it cannot be read in time)."""
        deadline = time.monotonic() + NOTE_WAIT_SECONDS
        while True:
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd, encoding="utf-8") as handle:
                    note: dict[str, Any] = json.loads(handle.read())
                    return note
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)  # the new holder has the lock but has not written its note yet

    def busy(self, holder: dict[str, Any] | None) -> RunDirBusy:
        who = (f"host {holder.get('host')} pid {holder.get('pid')} (since {holder.get('since')})" if holder
               else "another process")
        return RunDirBusy(f"The run directory is in use by another job: {who} holds {self.path}. Received: "
                          f"run_dir={str(self.run_dir)!r}; expected a directory no running job uses (wait "
                          f"for that job to end, then run the same command again to resume, or choose another "
                          f"run directory)")

    def release(self, unused: bool = False) -> None:
        """Unlock; ``unused``: the job wrote nothing, so a directory it created goes again."""
        if self._fd is None:
            return
        if unused and self.made_dir:
            self.path.unlink(missing_ok=True)  # unlinked while still held: no other job can have it
            try:
                self.run_dir.rmdir()  # only when empty
            except OSError:
                pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None


def launcher_holder() -> str | None:
    """The ``host:pid`` of the launcher supervising this job, if one is."""
    return os.environ.get(LAUNCHER_ENV) or None
