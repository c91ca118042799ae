"""The scheduler (rank 0): three engines over one run writer.

* :mod:`.synchronous`: every worker trains every round on the same weights (``aggregation.ssp = 0``);
* :mod:`.stale_synchronous`: bounded staleness, updates merged as they arrive (``aggregation.ssp > 0``);
* :mod:`.lbfgs`: full-batch L-BFGS (``model.optimizer = "lbfgs"``), one round trip per evaluation;
* :mod:`.engine`: what the round-based engines share (outer optimizer, sync schedule, NaN policy, survival);
* :mod:`.recorder`: the run writer every engine hands its finished rounds to; it never calls an engine;
* :mod:`.evaluation`, :mod:`.watchdog`: scoring the global model, and naming workers that do not answer.

Which engine (and which worker) a job runs is picked in one place, :func:`mpi_trainer.launch.roles.pick_roles`.
"""

from __future__ import annotations

from mpi_trainer.persistence.run_record import StopReason
from mpi_trainer.scheduler.engine import Engine
from mpi_trainer.scheduler.lbfgs import LbfgsScheduler
from mpi_trainer.scheduler.stale_synchronous import StaleSynchronousEngine
from mpi_trainer.scheduler.synchronous import SynchronousEngine

__all__ = ["Engine", "LbfgsScheduler", "StaleSynchronousEngine", "StopReason", "SynchronousEngine"]
