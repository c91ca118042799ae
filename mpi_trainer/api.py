"""``mpi_trainer.fit``: data-parallel training from a Python script.

Every rank of ``mpirun -n N python train.py`` calls :func:`fit` with the same
arguments (workers may pass ``None`` for the arrays). Rank 0 becomes the
scheduler and gets a :class:`FitResult`; the other ranks train and get
``None``. The command line's ``train`` is this same function with a TOML path.

:func:`init`, called at the top of the script before Keras is imported or
builds anything, places each rank (its GPU, its threads) while that can still
take effect, and says which rank this process is.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.errors import ConfigError, InputError

__all__ = ["FitResult", "Rank", "fit", "init"]


@dataclass
class FitResult:
    """What :func:`fit` returns on the scheduler (rank 0).

    ``history`` maps every numeric ``rounds.csv`` column (``test_loss``,
    ``test_accuracy``, ``train_<metric>``, ``wall_seconds``, ``bytes``...) to its
    per-round values, like ``keras.callbacks.History.history``. ``model`` holds
    the final weights (the best ones when early stopping or a NaN stop restored them).
    """

    history: dict[str, list[float]]
    model: Any
    run_dir: Path
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Rank:
    """This process in the ``mpirun`` job, as :func:`init` placed it."""

    rank: int
    size: int
    host: str
    device: str  # "cpu" or "cuda:<id>"
    threads: int | None  # None: the backend had started and kept its own default
    cores: list[int] | None = None  # the cores a CPU worker keeps to (train.bind_cores); None: any

    @property
    def is_scheduler(self) -> bool:
        """Rank 0 schedules, aggregates and evaluates; the others train."""
        return self.rank == 0


def init(*, device: str | None = None, scheduler_device: str | None = None, threads: int | None = None,
         bind_cores: bool | None = None) -> Rank:
    """Place this rank before the script imports Keras; returns which rank this process is.

    A Keras backend reads its GPUs and sizes its thread pools once, when it starts. :func:`fit`
    places each rank itself, which is enough while the model is passed as a function or a zoo
    name; a script that builds a model (or runs anything in Keras) first calls ``init`` at its
    top, on every rank, before ``import keras``. The arguments are ``train.device`` ("auto",
    "cpu", "gpu"), ``train.scheduler_device`` ("cpu", "gpu"), ``train.threads`` (0: the node's
    cores divided by its workers) and ``train.bind_cores`` (a CPU worker keeps to its own cores);
    left out, they are the defaults, and later :func:`fit` calls
    keep this placement (a config asking for another fails every rank). Calling it again is harmless.
    """
    from mpi_trainer.comm.transport import Transport
    from mpi_trainer.launch.job import load_config_everywhere, quiet_backend, start_rank

    quiet_backend()
    transport = Transport()
    given = {"train.device": device, "train.scheduler_device": scheduler_device, "train.threads": threads,
             "train.bind_cores": bind_cores}
    with _refused_together(transport):
        cfg = load_config_everywhere(transport, None, [(k, v) for k, v in given.items() if v is not None])
        _, placements = start_rank(transport, cfg)
    mine = placements[transport.rank]
    return Rank(transport.rank, transport.size, transport.host, mine.device, mine.threads, mine.cores)


@contextmanager
def _refused_together(transport: Any) -> Iterator[None]:
    """Input refused on every rank ends each with its message, once all have printed it."""
    from mpi_trainer.launch.job import AgreedInputError, report_error

    try:
        yield
    except AgreedInputError as exc:
        report_error(exc)
        transport.barrier()  # every rank has printed before any leaves
        # a refused job ends by this exception on every rank, not by MPI_Abort
        sys.excepthook = getattr(sys.excepthook, "previous", sys.excepthook)
        raise


def fit(model: Any = None, x: Any = None, y: Any = None, *, validation_data: tuple[Any, Any] | None = None,
        config: str | Path | dict[str, Any] | None = None, overrides: Sequence[str] | dict[str, Any] | None = None,
        epochs: int | None = None, batch_size: int | None = None, callbacks: Sequence[Any] = (),
        run_dir: str | Path | None = None, resume: bool = False,
        steps_per_epoch: int | None = None) -> FitResult | None:
    """Train ``model`` data-parallel on every rank of the ``mpirun`` job; rank 0 returns the result.

    Args:
        model: a function ``(input_shape, num_outputs) -> keras.Model`` (compiled or not), a built
            ``keras.Model``, a zoo name or ``"package.module:function"``; None: the config's ``model.name``.
            ``num_outputs`` is the number of classes for integer labels, the target width otherwise.
            A model built in the script is best built after :func:`init`, which places the rank first.
        x, y: the training data on the scheduler. Workers pass the same arrays (only block
            indices then travel) or None (their blocks are then sent to them). Without arrays
            the config's ``data.source`` is read. ``x`` may also be a pipeline that every rank
            builds: a ``tf.data.Dataset``, a ``dataset_fn(context)`` returning one per worker, a
            ``keras.utils.PyDataset`` or a generator of ``(x, y)`` batches (then ``y`` is None;
            see :mod:`mpi_trainer.data.adapters` for how each is cut into blocks).
        validation_data: ``(x, y)`` or a pipeline, scored after every round (the ``test_*`` columns);
            without it ``data.test_size`` of ``x, y`` (of a pipeline: its last batches) is held out.
        steps_per_epoch: a pipeline of unknown or infinite length (a generator, ``repeat()``): the
            batches one round reads over all workers.
        config: a TOML path or a dict of sections; ``overrides``: ``"key=value"`` strings or a dict
            of dotted keys; ``epochs`` (rounds) and ``batch_size`` are shortcuts for train.*.
        callbacks: Keras callbacks run on the scheduler once per round (see
            :mod:`mpi_trainer.scheduler.callbacks`); ``model.stop_training = True`` ends the job.
        run_dir: where rank 0 writes (default: ``launch``'s, else new); a run there resumes, a complete one
            trains nothing. A preemption signal raises :class:`~mpi_trainer.errors.Preempted` (exit 75).

    Bad input raises :class:`mpi_trainer.errors.InputError` on every rank before training. An error on
    one rank during the job raises on every rank (:class:`~mpi_trainer.comm.transport.PeerFailure`,
    naming it, on the others); a rank that stops answering ends the job within its wait bound.
    """
    from mpi_trainer.launch.failures import fail_together
    from mpi_trainer.launch.job import quiet_backend

    quiet_backend()
    transport = _job_transport()
    with _refused_together(transport), fail_together(transport):
        finished = _run(transport, model, (x, y, validation_data, steps_per_epoch), config, overrides,
                        {"train.epochs": epochs, "train.batch_size": batch_size}, callbacks, run_dir, resume)
    return None if finished is None else _result(*finished)


def _job_transport() -> Any:
    """A transport on a communicator of its own (what a failed job leaves unread stays there), whose
    waits are bounded from the start by the set-up default (the config may change it)."""
    from mpi_trainer.algorithms.wait_bounds import SETUP_SECONDS, for_rank
    from mpi_trainer.comm.transport import Transport

    world = Transport()
    world.bound = for_rank(world.rank, SETUP_SECONDS)
    return world.duplicate()


def _run(transport: Any, model: Any, data: tuple, config: Any, overrides: Any, shortcuts: dict[str, Any],
         callbacks: Sequence[Any], run_dir: Any, resume: bool) -> Any:
    from mpi_trainer.data.adapters import fit_input
    from mpi_trainer.launch.job import JobInputs, agree, load_config_everywhere, run_job

    arrays = builder = pipeline = None
    pairs, error = [], None
    try:  # a bad argument on one rank must fail every rank, not leave them waiting for it
        pipeline = fit_input(*data)  # None: arrays, or nothing (data.source)
        arrays = None if pipeline else _as_arrays(*data[:3])
        builder, model_overrides = _model_source(model)
        given = [(k, v) for k, v in shortcuts.items() if v is not None]
        pairs = _pairs(overrides) + given + model_overrides
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    arrays, data_overrides = _agree_on_arrays(transport, arrays) if not _agree_on_pipeline(transport, pipeline) \
        else (None, [("data.source", "pipeline")])
    cfg = load_config_everywhere(transport, str(config) if isinstance(config, Path) else config,
                                 pairs + data_overrides)
    refused = transport.rank == 0 and callbacks and cfg.model.uses_lbfgs
    agree(transport, "`callbacks` are not available with model.optimizer='lbfgs' (its iterations are not "
                     "rounds). Received: callbacks with model.optimizer='lbfgs'" if refused else None)
    inputs = JobInputs(arrays, builder, list(callbacks) if transport.rank == 0 else [],
                       config if isinstance(config, (str, Path)) else None, pipeline, pipeline and data[2])
    return run_job(transport, cfg, inputs, None if run_dir is None else str(run_dir), resume)


def _pairs(overrides: Sequence[str] | dict[str, Any] | None) -> list[Any]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(f"`overrides` must be a list of 'key=value' strings or a dict. Received: {overrides!r}")
    return list(overrides.items()) if isinstance(overrides, dict) else list(overrides)


def _model_source(model: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """(the builder to call, config overrides naming the model)."""
    if model is None:
        return None, []
    if isinstance(model, str):
        return None, [("model.name", model)]
    if not callable(model):
        raise ConfigError(f"`model` must be a Keras model, a function (input_shape, num_outputs) -> model, "
                          f"a zoo name or 'package.module:function'. Received: {type(model).__name__}")
    name = getattr(model, "__qualname__", None) or getattr(model, "name", None) or type(model).__name__
    return model, [("model.name", str(name))]


def _as_arrays(x: Any, y: Any, validation_data: Any) -> Any:
    """This rank's ``x, y`` (and ``validation_data``) as the reader's arrays, or None."""
    from mpi_trainer.data.readers import RawArrays

    if x is None and y is None:
        return None
    if x is None or y is None:
        raise ConfigError(f"`x` and `y` go together. Received: x={_kind(x)}, y={_kind(y)}")
    test = validation_data if validation_data is not None else (None, None)
    if len(test) != 2:
        raise ConfigError(f"`validation_data` must be a pair (x, y). Received: {len(test)} items")
    return RawArrays(np.asarray(x), np.asarray(y), *(None if a is None else np.asarray(a) for a in test))


def _agree_on_arrays(transport: Any, arrays: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """The arrays this rank loads, and the data.* overrides every rank applies.

    Rank 0's arrays are the data. A worker that passed the same ones reads its block from them;
    if any worker passed none (or others), every worker gets its rows sent (``data.placement = scatter``).
    """
    prints = transport.allgather(_fingerprint(arrays))
    if prints[0] is None:
        return None, []
    shared = all(p == prints[0] for p in prints[1:])
    return (arrays if shared or transport.rank == 0 else None), [
        ("data.source", "arrays"), ("data.placement", "shared" if shared else "scatter")]


def _agree_on_pipeline(transport: Any, pipeline: Any) -> bool:
    """Whether the data is a pipeline; every rank builds one, of the same kind, or all fail."""
    from mpi_trainer.launch.job import agree

    kinds = transport.allgather(None if pipeline is None else pipeline.kind)
    differ = any(kind != kinds[0] for kind in kinds) and any(kinds)
    agree(transport, f"Every rank must build the same kind of input (each builds its own pipeline). Received: "
                     f"{', '.join(f'rank {r}: {k}' for r, k in enumerate(kinds))}" if differ else None)
    return kinds[0] is not None


def _kind(value: Any) -> str:
    return "None" if value is None else f"{type(value).__name__} of shape {getattr(value, 'shape', '?')}"


def _fingerprint(arrays: Any) -> tuple | None:
    """Shapes, dtypes and a checksum of the labels: equal on ranks that were handed the same data."""
    if arrays is None:
        return None
    parts = [arrays.x, arrays.y, arrays.x_test, arrays.y_test]
    shapes = tuple(None if a is None else (a.shape, str(a.dtype)) for a in parts)
    return shapes, zlib.crc32(np.ascontiguousarray(arrays.y).tobytes())


def _result(engine: Any, summary: dict[str, Any]) -> FitResult:
    rounds = engine.rounds
    numeric = [key for key in (rounds[0] if rounds else {}) if _is_number(rounds[0][key])]
    history = {key: [float(row[key]) for row in rounds] for key in numeric}
    return FitResult(history, engine.model, Path(engine.run_dir), summary)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)

