"""The scheduler (rank 0): two engines over one round recorder, and full-batch L-BFGS.

* :mod:`.synchronous`: every worker trains every round on the same weights (``aggregation.ssp = 0``);
* :mod:`.stale`: bounded staleness, updates merged as they arrive (``aggregation.ssp > 0``);
* :mod:`.lbfgs`: full-batch L-BFGS (``model.optimizer = "lbfgs"``), one round trip per evaluation;
* :mod:`.recorder`: what happens once a round's weights are in, for both engines;
* :mod:`.evaluation`, :mod:`.watchdog`: scoring the global model, and naming workers that do not answer.
"""

from __future__ import annotations

from mpi_trainer.config import Config
from mpi_trainer.persistence.run_record import StopReason
from mpi_trainer.scheduler.engine import Engine
from mpi_trainer.scheduler.lbfgs import LbfgsScheduler
from mpi_trainer.scheduler.stale import StaleEngine
from mpi_trainer.scheduler.synchronous import SynchronousEngine

__all__ = ["Engine", "LbfgsScheduler", "StaleEngine", "StopReason", "SynchronousEngine", "engine_class"]


def engine_class(cfg: Config) -> type[Engine] | type[LbfgsScheduler]:
    """The one place that picks rank 0's engine: L-BFGS for ``model.optimizer = "lbfgs"``, else the
    synchronous engine at ``ssp = 0`` and the stale-synchronous one otherwise (or when forced for checks)."""
    if cfg.model.uses_lbfgs:
        return LbfgsScheduler
    return StaleEngine if cfg.aggregation.ssp > 0 or cfg.debug.async_engine else SynchronousEngine
