"""Data-parallel ``fit`` of the user's own ``keras.Model`` object, with Keras' own machinery on every rank."""

from mpi_trainer.trainer.fit import fit_model, plain_fit

__all__ = ["fit_model", "plain_fit"]
