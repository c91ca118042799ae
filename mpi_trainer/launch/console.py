"""The command line's helpers: a quiet backend and one error line."""

from __future__ import annotations

import os
import sys

from mpi_trainer.errors import EXIT_INPUT_ERROR


def quiet_backend() -> None:
    """Keep TensorFlow's C++ start-up chatter off the console unless the user asked for it."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # oneDNN stays on (TensorFlow's default; why, with the figure: docs/commands.md, "Backends").


def report_error(exc: BaseException) -> int:
    """``mpi_trainer: error: <message>`` on stderr; returns the exit status of bad input."""
    sys.stderr.write(f"mpi_trainer: error: {exc}\n")
    sys.stderr.flush()
    return EXIT_INPUT_ERROR
