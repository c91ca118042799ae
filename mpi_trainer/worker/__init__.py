"""The worker role (ranks 1..N-1): local training on its block, orders from the scheduler."""

from mpi_trainer.worker.worker import Worker

__all__ = ["Worker"]
