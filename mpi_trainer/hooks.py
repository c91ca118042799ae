"""Test hooks that stop a rank (``debug.freeze_rank``: SIGSTOP), to check that the others do not wait for ever."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from mpi_trainer.logs import get_logger


def maybe_freeze(debug: Any, rank: int, round_index: int) -> None:
    """Stop this process when ``debug.freeze_rank`` is ``rank`` and ``debug.freeze_round`` is ``round_index``
    (-1: set-up). Only a SIGCONT, or the job's end, moves it again."""
    if debug.freeze_rank != rank or debug.freeze_round != round_index:
        return
    where = "during set-up" if round_index < 0 else f"after round {round_index}"
    get_logger().warning("debug: rank %d stops itself (SIGSTOP) %s (debug.freeze_rank)", rank, where)
    for handler in get_logger().handlers:
        handler.flush()
    sys.stdout.flush()  # a stopped process flushes nothing, and the job's end loses what it buffered
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)
