"""mpi_trainer: synchronous and stale-synchronous data-parallel Keras training under mpirun."""

__version__ = "0.1.0"
__all__ = ["__version__"]
