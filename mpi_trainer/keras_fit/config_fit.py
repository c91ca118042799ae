"""A model and data named by the config, trained as a ``keras.Model``: the command line's ``train CONFIG``
and ``mpi_trainer.fit(build_fn | zoo name)`` without arrays.

Every rank reads the config's data source and builds and compiles the config's model itself (rank 0's
initial state reaches the others with the first epoch's order); then the fit is the one a script's
``keras.Model`` gets (:func:`~.fit.fit_model`), with the config's test split as the validation data
(``val_*`` in the History, ``test_*`` in rounds.csv) and the run directory the command line always keeps.
A config asking for what that fit does not do yet (:func:`engine_reason`) is trained by the engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer.errors import InputError
from mpi_trainer.keras_fit.settings import refusals
from mpi_trainer.launch.agreement import agree, agreed

if TYPE_CHECKING:
    from mpi_trainer.comm.transport import Transport
    from mpi_trainer.config import Config

# The keys this entry applies itself, before the fit: the model it builds and compiles, the data it reads.
APPLIED = frozenset({
    "model.name", "model.optimizer", "model.learning_rate", "model.activation", "model.loss", "model.metrics",
    "data.source", "data.test_size", "data.label", "data.features", "data.datasets", "data.image_size",
    "data.color_mode", "data.feature_shape", "data.feature_dtype", "data.stream", "data.validation_size",
    "train.shuffle", "train.seed",
})


def engine_reason(cfg: Config) -> str | None:
    """Why the engines train ``cfg`` rather than the Keras fit (the first setting that fit does not apply
    yet), or None when the Keras fit takes it."""
    if cfg.model.uses_lbfgs:
        return "model.optimizer = 'lbfgs'"
    if cfg.data.is_image_folder or cfg.data.is_tfrecord:
        return f"data.source {cfg.data.source!r}, read as a pipeline (an image folder or TFRecord files)"
    if cfg.data.stream is True:
        return "data.stream = true"
    if cfg.data.stream_auto and cfg.data.is_file:
        from mpi_trainer.config.choices import STREAM_SUFFIXES

        if Path(cfg.data.source).suffix.lower() in STREAM_SUFFIXES:
            return "data.stream = 'auto' on a file that may stream"
    found = refusals(cfg, applied=APPLIED) + _ssp_conflicts(cfg)
    return found[0] if found else None


def _ssp_conflicts(cfg: Config) -> list[str]:
    from mpi_trainer.keras_fit.fit import ssp_conflicts

    return ssp_conflicts(cfg)


def fit_config(transport: Transport, cfg: Config, config: Any, overrides: list[Any], run_dir: Any, resume: bool,
               builder: Any = None, callbacks: Sequence[Any] = (), config_path: str | Path | None = None) -> Any:
    """Every rank: the config's data and model, then the Keras fit; returns the History on every rank."""
    from mpi_trainer.keras_fit.fit import fit_model, scored_epochs
    from mpi_trainer.launch.job import start_rank
    from mpi_trainer.launch.run_dir import chosen_path

    start_rank(transport, cfg)  # placed before Keras starts: the model is built below
    agree(transport, "`--resume` needs the run directory to continue. Received: no --run-dir; expected --run-dir "
                     "DIR of an earlier run" if resume and not (run_dir or _launch_run_dir()) else None)
    dataset = model = error = None
    try:
        dataset, model = _data_and_model(cfg, builder)
    except (InputError, ValueError, OSError) as exc:
        error = str(exc)
    agree(transport, error)
    dataset, model = agreed(dataset), agreed(model)
    path = transport.bcast_object(str(chosen_path(run_dir, config_path)) if transport.rank == 0 else None)
    frequency = scored_epochs(cfg.evaluation.every, cfg.train.epochs)
    validation, callbacks = _validation(dataset, cfg.train.batch_size, list(callbacks) if transport.rank == 0 else [],
                                        transport.rank == 0)
    kwargs = {"x": dataset.x_train, "y": dataset.y_train, "batch_size": cfg.train.batch_size,
              "epochs": cfg.train.epochs, "verbose": 2, "shuffle": cfg.train.shuffle, "callbacks": callbacks,
              "validation_data": validation, "validation_freq": frequency}
    describe = {"dataset": dataset.describe(), "model": cfg.model.name}
    history = fit_model(transport, model, kwargs, config, overrides, path, resume, applied=APPLIED,
                        describe=describe)
    if transport.rank == 0:
        print(f"run directory: {path}", flush=True)
    return history


def _validation(dataset: Any, batch_size: int, callbacks: list[Any], scheduler: bool) -> tuple[Any, list[Any]]:
    """The fit's validation data and rank 0's callbacks: the validation split, with the test split scored
    after each epoch the validation data is (``evaluation.every``) as ``test_*`` (first among the callbacks,
    so that every other one sees them); without a validation split, the test split is the validation data
    (``val_*``, and rounds.csv's ``test_*``)."""
    test = (dataset.x_test, dataset.y_test) if len(dataset.y_test) else None
    if not len(dataset.y_val):
        return test, callbacks
    scores = [_test_scores(test, batch_size)] if test and scheduler else []
    return (dataset.x_val, dataset.y_val), scores + callbacks


def _test_scores(test: tuple[Any, Any], batch_size: int) -> Any:
    """A Keras callback: rank 0 scores the test split after each epoch whose validation data was scored (its
    logs hold ``val_*``), adding ``test_<metric>`` to them."""
    import keras

    from mpi_trainer.keras_fit.rounds import reusable_input

    scoring = reusable_input({"x": test[0], "y": test[1], "batch_size": batch_size})

    class TestScores(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if logs is not None and any(name.startswith("val_") for name in logs):
                scores = self.model.evaluate(**scoring, verbose=0, return_dict=True)
                logs.update({f"test_{name}": float(value) for name, value in scores.items()})

    return TestScores()


def _launch_run_dir() -> str | None:
    import os

    from mpi_trainer.launch.run_dir import RUN_DIR_ENV

    return os.environ.get(RUN_DIR_ENV)


def _data_and_model(cfg: Config, builder: Any) -> tuple[Any, Any]:
    """This rank's copy of the config's data (the training and test splits) and its compiled model."""
    import keras

    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.models import build_model

    dataset = load_dataset(cfg.data, cfg.train.seed)
    keras.utils.set_random_seed(cfg.train.seed)
    model, _ = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes, builder)
    return dataset, model
