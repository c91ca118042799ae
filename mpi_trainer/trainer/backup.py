"""Keras' ``BackupAndRestore`` honoured by a data-parallel fit.

In one process the callback saves the model's weights and the epoch at every epoch's end, restores
them when the same ``fit`` starts again after an interruption, and deletes its directory when the
fit ends. In a data-parallel fit the state lives on every rank (the combined weights, the optimizers'
moments and step counts, the outer optimizer's momentum), so rank 0 running the callback on its own
model would restore the weights alone and retrain every epoch. Instead the run's own checkpoints
stand for the backup: the callback leaves rank 0's callback list, the fit checkpoints every epoch,
and a fit started again resumes at the epoch one process would (callbacks such as
``LearningRateScheduler`` see that epoch, the optimizer its step count). Without a ``run_dir`` the
run directory is the callback's ``backup_dir``, deleted when the fit completes (as Keras deletes
it, ``delete_checkpoint=True``); with one, the run directory holds the checkpoints and stays.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.run_dir import RUN_DIR_ENV

if TYPE_CHECKING:
    from mpi_trainer.config import Config


@dataclass(frozen=True)
class Backup:
    """The script's ``BackupAndRestore``, as the fit honours it."""

    directory: Path  # the callback's backup_dir
    in_backup_dir: bool  # the run directory is the backup_dir (no run_dir given)
    delete: bool  # delete_checkpoint: the backup_dir goes when the fit completes

    def describe(self) -> str:
        where = (f"the run directory is its backup_dir {str(self.directory)!r}"
                 + (", deleted when the fit completes" if self.delete else "")
                 if self.in_backup_dir else "the run directory holds its checkpoints")
        return (f"BackupAndRestore: the run's checkpoints, taken every epoch, stand for its backup ({where}); "
                f"a fit started again resumes after the last checkpointed epoch on every rank")


def backup_callbacks(callbacks: Any) -> list[Any]:
    import keras

    return [c for c in callbacks or [] if isinstance(c, keras.callbacks.BackupAndRestore)]


def take_backup(kwargs: dict[str, Any], run_dir: Any) -> tuple[dict[str, Any], Any, Backup | None]:
    """``kwargs`` without the script's ``BackupAndRestore``, the run directory the fit writes, and the
    backup it stands for (None: the script has none). Refuses what a data-parallel fit cannot restore."""
    found = backup_callbacks(kwargs.get("callbacks"))
    if not found:
        return kwargs, run_dir, None
    if len(found) > 1:
        raise ConfigError(f"`callbacks` holds {len(found)} BackupAndRestore callbacks. Received: backup_dir "
                          f"{[c.backup_dir for c in found]}; expected one")
    callback = found[0]
    if callback.save_freq != "epoch":
        raise ConfigError(f"BackupAndRestore(save_freq={callback.save_freq!r}) backs up within an epoch; a "
                          f"data-parallel fit's state is whole only between epochs, where it checkpoints. "
                          f"Received: save_freq={callback.save_freq!r}; expected save_freq='epoch'")
    if "://" in str(callback.backup_dir):
        raise ConfigError(f"BackupAndRestore's backup_dir is the run directory, a local (or shared) path. "
                          f"Received: backup_dir={callback.backup_dir!r}; expected a filesystem path")
    given = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
    backup = Backup(Path(callback.backup_dir), given is None, bool(callback.delete_checkpoint))
    rest = [c for c in kwargs.get("callbacks") or [] if c is not callback]
    return {**kwargs, "callbacks": rest}, given if given is not None else backup.directory, backup


def every_epoch(cfg: Config, backup: Backup | None) -> Config:
    """The config with a checkpoint every epoch when a backup stands for ``BackupAndRestore``."""
    if backup is None or cfg.checkpoint.every == 1:
        return cfg
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, every=1))


def release_backup(backup: Backup | None, summary: dict[str, Any] | None, rank: int) -> None:
    """Rank 0, once the fit completed: the backup_dir deleted as Keras deletes it (``delete_checkpoint``)."""
    if rank != 0 or backup is None or not backup.in_backup_dir or not backup.delete:
        return
    if summary is not None and summary.get("completed", True):
        shutil.rmtree(backup.directory, ignore_errors=True)
