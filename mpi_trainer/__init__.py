"""mpi_trainer: synchronous and stale-synchronous data-parallel Keras training under mpirun."""

__version__ = "0.1.0"

from mpi_trainer.api import Rank, fit, init  # noqa: E402 - after __version__, which setup.cfg reads

__all__ = ["Rank", "__version__", "fit", "init"]
