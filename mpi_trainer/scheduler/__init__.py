"""The scheduler (rank 0): two engines over one round recorder.

* :mod:`.synchronous`: every worker trains every round on the same weights (``aggregation.ssp = 0``);
* :mod:`.stale`: bounded staleness, updates merged as they arrive (``aggregation.ssp > 0``);
* :mod:`.recorder`: what happens once a round's weights are in, for both engines;
* :mod:`.evaluation`, :mod:`.watchdog`: scoring the global model, and naming workers that do not answer.
"""

from __future__ import annotations

from mpi_trainer.config import Config
from mpi_trainer.scheduler.engine import Engine
from mpi_trainer.scheduler.recorder import StopReason
from mpi_trainer.scheduler.stale import StaleEngine
from mpi_trainer.scheduler.synchronous import SynchronousEngine

__all__ = ["Engine", "StaleEngine", "StopReason", "SynchronousEngine", "engine_class"]


def engine_class(cfg: Config) -> type[Engine]:
    """The synchronous engine at ``ssp = 0``, the stale-synchronous one otherwise (or when forced for checks)."""
    return StaleEngine if cfg.aggregation.ssp > 0 or cfg.debug.async_engine else SynchronousEngine
