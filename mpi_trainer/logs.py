"""Console and file logging tagged with the rank (rank 0 also logs to the run directory's train.log)."""

from __future__ import annotations

import io
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

LOGGER_NAME = "mpi_trainer"
# The least log.verbosity at which the console shows a record of this level (warnings always).
_CONSOLE_VERBOSITY = {logging.DEBUG: 2, logging.INFO: 1}


@dataclass
class ConsoleState:
    """What the console shows: made by :func:`setup_logging` for its console handler, read by that
    handler's filter and formatter, and told by a progress bar when it owns the last console line.

    A record may carry ``extra={"verbosity": v}`` (shown from verbosity ``v`` on, whatever its
    level) and ``extra={"in_bar": True}`` (left off the console while a progress bar shows it).
    """

    rank: int = 0
    verbosity: int = 1
    bar_active: bool = False


class _ConsoleFilter(logging.Filter):
    def __init__(self, state: ConsoleState) -> None:
        super().__init__()
        self.state = state

    def filter(self, record: logging.LogRecord) -> bool:
        if self.state.bar_active and getattr(record, "in_bar", False):
            return False
        needed: int = getattr(record, "verbosity", _CONSOLE_VERBOSITY.get(record.levelno, 0))
        if self.state.rank != 0 and record.levelno < logging.WARNING:
            needed = max(needed, 2)  # workers speak at verbosity 2 only
        return self.state.verbosity >= needed


class _ConsoleFormatter(logging.Formatter):
    def __init__(self, state: ConsoleState, fmt: str, datefmt: str) -> None:
        super().__init__(fmt, datefmt)
        self.state = state

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        # A progress bar owns the last console line: clear it so the record does not run into it.
        return "\r\x1b[K" + text if self.state.bar_active else text


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is now (a test harness may swap and close the one seen at set-up);
    holds the console's :class:`ConsoleState`."""

    def __init__(self, state: ConsoleState) -> None:
        super().__init__()
        self.state = state

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: object) -> None:
        pass


def setup_logging(rank: int, size: int, host: str, verbosity: int) -> logging.Logger:
    """Timestamped console log filtered by log.verbosity; workers speak at verbosity 2 only."""
    state = ConsoleState(rank, verbosity)
    logger = logging.getLogger(LOGGER_NAME)
    logger.handlers.clear()
    logger.propagate = False
    handler = _StdoutHandler(state)
    handler.setFormatter(_ConsoleFormatter(
        state, f"%(asctime)s [rank {rank}/{size} {host}] %(levelname)s %(message)s", "%H:%M:%S"))
    handler.addFilter(_ConsoleFilter(state))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger


class _NoFollowFileHandler(logging.FileHandler):
    """A log file appended to, never through a symbolic link (``O_NOFOLLOW``)."""

    def _open(self) -> io.TextIOWrapper:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.baseFilename, flags, 0o644)
        except OSError as exc:
            raise OSError(exc.errno, f"{self.baseFilename}: {exc.strerror} (a symbolic link is never "
                                     f"written through)") from None
        return os.fdopen(fd, "a", encoding=self.encoding)


def add_log_file(path: Path) -> None:
    """Everything rank 0 logs, at every level, also goes to ``path``."""
    logger = logging.getLogger(LOGGER_NAME)
    handler = _NoFollowFileHandler(path, mode="a", encoding="utf-8", delay=True)
    handler.stream = handler._open()  # now: a planted link is refused before the job goes on
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    handler.setLevel(logging.DEBUG)
    logger.addHandler(handler)


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
