"""Test hooks: faults and slowness injected on purpose by tests and benchmarks, never part of the config.

They are set the way outside fault-injection scripts set them, with the config's spelling
(``--set debug.batch_delay=0.04`` on ``train`` and ``launch``, a ``[debug]`` table, or
``overrides={"debug.nan_rank": 1}`` in :func:`mpi_trainer.fit`): the config loader takes the
``debug`` section off before it builds the sections of :class:`~mpi_trainer.config.Config`
(:func:`take_from`) and hands the checked hooks to the config it returns as ``test_hooks``, a
field that is no section: a run's config.toml, ``check`` and the unknown-key hints never see it,
and no two configs share it. Every rank loads the config itself, so every rank holds the same
hooks; the fit hands them to the roles that inject a fault, in their constructors.

What each hook does:

* ``batch_delay``: every worker sleeps that many seconds after each training batch (simulated
  per-batch work, so that a benchmark on a small, busy machine measures scheduling rather than CPU
  contention); each rank in ``slow_ranks`` then takes ``slow_factor`` times as long per batch
  (batch plus delay) and plays a straggler (:mod:`mpi_trainer.trainer.slowdown`).
* ``nan_rank`` (0 = off): that worker's weights are poisoned with NaN in round ``nan_round``, to
  exercise the NaN guard.
* ``crash_rank`` (0 = off): that worker (its starting rank) ends as ``kill -9`` would in round
  ``crash_round``, at the start of its training (``crash_phase = "train"``) or after it sent its
  report, before its weights go out (``"contribute"``), to exercise ``fault.survive``.
* ``freeze_rank`` (-1 = off): that rank stops itself with SIGSTOP as a hung process would, during
  set-up when ``freeze_round`` is -1, else once its part of round ``freeze_round`` is done.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from mpi_trainer.errors import ConfigError
from mpi_trainer.logs import get_logger

PREFIX = "debug"  # the hooks' section, as `--set debug.<name>=...` spells it
CRASH_PHASES = ("train", "contribute")


def _reject(name: str, value: Any, expected: str) -> None:
    key = f"{PREFIX}.{name}"
    raise ConfigError(f"`{key}` {expected}. Received: {key}={value!r}")


@dataclass(frozen=True)
class TestHooks:
    """The hooks in force in this process (all off by default); see the module's docstring."""

    __test__ = False  # not a pytest test class, whatever its name

    slow_ranks: list[int] = field(default_factory=list)
    slow_factor: float = 1.0
    batch_delay: float = 0.0
    nan_rank: int = 0
    nan_round: int = 0
    crash_rank: int = 0
    crash_round: int = 0
    crash_phase: str = "contribute"
    freeze_rank: int = -1
    freeze_round: int = -1

    def __post_init__(self) -> None:
        checks = [
            ("slow_factor", self.slow_factor >= 1, "must be >= 1 (1 = normal speed)"),
            ("freeze_rank", self.freeze_rank >= -1, "must be a rank, or -1 (off)"),
            ("freeze_round", self.freeze_round >= -1, "must be a round, or -1 (during set-up)"),
            *((name, getattr(self, name) >= 0, "must be >= 0")
              for name in ("batch_delay", "nan_rank", "nan_round", "crash_rank", "crash_round")),
            ("crash_phase", self.crash_phase in CRASH_PHASES, f"must be one of {list(CRASH_PHASES)}"),
            ("slow_ranks", all(rank >= 1 for rank in self.slow_ranks),
             "must list worker ranks (each >= 1; rank 0 is the scheduler)"),
        ]
        for name, ok, expected in checks:
            if not ok:
                _reject(name, getattr(self, name), expected)

    @classmethod
    def from_table(cls, table: Any) -> TestHooks:
        """Hooks from the ``debug`` table of a config (names without the prefix), types checked."""
        if not isinstance(table, dict):
            raise ConfigError(f"`{PREFIX}` must be a table of keys. Received: {PREFIX}={table!r}")
        names = [item.name for item in dataclasses.fields(cls)]
        for name in table:
            if name not in names:
                raise _unknown_hook(name, names)
        defaults = cls()
        return cls(**{name: _coerce(name, value, getattr(defaults, name)) for name, value in table.items()})

    def slows(self, rank: int) -> bool:
        return rank in self.slow_ranks

    def freeze_at(self, rank: int, round_index: int) -> None:
        """Stop this process when ``freeze_rank`` is ``rank`` and ``freeze_round`` is ``round_index``
        (-1: set-up). Only a SIGCONT, or the job's end, moves it again."""
        if self.freeze_rank != rank or self.freeze_round != round_index:
            return
        where = "during set-up" if round_index < 0 else f"after round {round_index}"
        get_logger().warning("test hook: rank %d stops itself (SIGSTOP) %s (%s.freeze_rank)", rank, where, PREFIX)
        for handler in get_logger().handlers:
            handler.flush()
        sys.stdout.flush()  # a stopped process flushes nothing, and the job's end loses what it buffered
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSTOP)

    def check_slow_ranks(self, world_size: int) -> None:
        """Every rank to slow down must be a worker rank of this job."""
        if any(not 1 <= rank < world_size for rank in self.slow_ranks):
            raise ConfigError(f"`{PREFIX}.slow_ranks` must name worker ranks 1..{world_size - 1} of this "
                              f"{world_size}-rank job. Received: {PREFIX}.slow_ranks={self.slow_ranks}")


def _coerce(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of the hook's default (an int is a float; a bool is not a number)."""
    kind = type(default)
    if kind is list:
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        expected = "must be a list of ints"
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value, expected = float(value) if ok else value, "must be of type float"
    else:
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        expected = f"must be of type {kind.__name__}"
    if not ok:
        _reject(name, value, expected)
    return value


def _unknown_hook(name: str, names: list[str]) -> ConfigError:
    known = [f"{PREFIX}.{n}" for n in names]
    close = difflib.get_close_matches(f"{PREFIX}.{name}", known, n=1, cutoff=0.6)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return ConfigError(f"Unknown config key `{PREFIX}.{name}`.{hint} Known keys: {', '.join(known)}")


def take_from(table: dict[str, Any]) -> TestHooks:
    """Remove the ``debug`` section from a config's table (in place) and return its hooks, checked."""
    return TestHooks.from_table(table.pop(PREFIX, {}))


# -- what a config cannot be combined with ------------------------------------------------------------
def check_with(cfg: Any, hooks: TestHooks) -> None:
    """Refuse hooks that the config cannot honour (NaN injection into L-BFGS, which trains no weights of
    its own on the workers); ``cfg`` is a loaded config."""
    if hooks.nan_rank > 0 and cfg.model.uses_lbfgs:
        raise ConfigError(f"`{PREFIX}.nan_rank` is not available with model.optimizer='lbfgs' (full-batch "
                          f"L-BFGS): it poisons trained weights, which L-BFGS has none of. Received: "
                          f"{PREFIX}.nan_rank={hooks.nan_rank!r} with model.optimizer='lbfgs'")


# -- injecting -------------------------------------------------------------------------------------
def end_rank(transport: Any) -> None:
    """End this rank as ``kill -9`` would (``crash_rank``): a rank that stands in a thread of a local world
    leaves it (:meth:`mpi_trainer.comm.local.LocalTransport.leave_world`, which ends the thread); a process
    ends at once, without MPI_Finalize or an exit code."""
    leave = getattr(transport, "leave_world", None)
    if leave is not None:
        leave()
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)
