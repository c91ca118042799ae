"""``mpi_trainer.fit``: data-parallel training from a Python script.

Every rank of ``mpirun -n N python train.py`` calls :func:`fit` with the same
arguments (workers may pass ``None`` for the arrays). Rank 0 becomes the
scheduler, the other ranks train, and every rank gets the same
``keras.callbacks.History``. A ``keras.Model`` trains with Keras' own ``fit`` on every
worker (:mod:`mpi_trainer.trainer`). The command line's ``train`` calls this function with a
TOML path and no model object: every rank then builds the config's model and reads its data,
and the job is that same fit (:mod:`mpi_trainer.trainer.config_fit`). ``fit(build_fn, x, y)``
with arrays or a pipeline is that fit too (:func:`~mpi_trainer.trainer.config_fit.fit_built`).

:func:`init`, called at the top of the script before Keras is imported or
builds anything, places each rank (its GPU, its threads) while that can still
take effect, and says which rank this process is.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpi_trainer.errors import ConfigError, InputError

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport
    from mpi_trainer.config import Config

__all__ = ["Rank", "fit", "init"]


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
    left out, they are ``launch --set``'s (whose other settings the placement follows too: synchronous
    SGD on JAX keeps two cores a worker) or the defaults, and later :func:`fit` calls
    keep this placement (a config asking for another fails every rank). Calling it again is harmless.
    Without ``mpirun`` (one process) it places nothing: the script then runs as plain Keras.
    """
    from mpi_trainer.comm import open_transport
    from mpi_trainer.comm.transport import abort_on_error, install_abort_on_error
    from mpi_trainer.launch.job import load_config_everywhere, quiet_backend, start_rank

    quiet_backend()
    transport = open_transport()
    if transport.size == 1:  # no mpirun: the script is plain Keras, and Keras places itself
        return Rank(0, 1, transport.host, "cpu", None)
    given = {"train.device": device, "train.scheduler_device": scheduler_device, "train.threads": threads,
             "train.bind_cores": bind_cores}
    with abort_on_error(transport), _refused_together(transport):
        # launch's --set as well: what it asks of the placement (synchronous SGD on JAX keeps two cores) holds
        chosen = {key: value for key, value in given.items() if value is not None}
        cfg = load_config_everywhere(transport, None, _with_launch_overrides(chosen) or [])
        _, placements = start_rank(transport, cfg)
    # The script's code up to fit is part of the job: a rank that fails there ends every rank at once,
    # not after fit's set-up bound; fit puts back the script's own hook when it returns.
    install_abort_on_error(transport)
    mine = placements[transport.rank]
    return Rank(transport.rank, transport.size, transport.host, mine.device, mine.threads, mine.cores)


@contextmanager
def _refused_together(transport: RankTransport) -> Iterator[None]:
    """Input refused on every rank ends each with its message, once all have printed it."""
    from mpi_trainer.launch.job import AgreedInputError, report_error

    try:
        yield
    except AgreedInputError as exc:
        report_error(exc)
        transport.barrier()  # every rank has printed before any leaves
        raise  # a refused job ends by this exception on every rank, not by MPI_Abort (abort_on_error)


def fit(model: Any = None, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int | None = None,
        verbose: Any = "auto", callbacks: Sequence[Any] | None = None, validation_split: float = 0.0,
        validation_data: Any = None, shuffle: Any = True, class_weight: dict[int, float] | None = None,
        sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: int | None = None,
        validation_steps: int | None = None, validation_batch_size: int | None = None, validation_freq: Any = None,
        *, config: str | Path | dict[str, Any] | None = None, overrides: Sequence[str] | dict[str, Any] | None = None,
        run_dir: str | Path | None = None, resume: bool = False) -> Any:
    """``model.fit(x, y, ...)``, data-parallel over the ``mpirun`` job; every rank calls it and gets the History.

    The arguments after ``model`` are ``keras.Model.fit``'s with Keras' meaning; docs/api.md's table
    says what data-parallel training changes (``batch_size`` is each worker's; an epoch is a round;
    ``callbacks`` run on rank 0 once per round; validation data is scored as ``val_*``; without it
    nothing is held out). ``model``: a ``keras.Model``, which every rank trains itself with Keras' own
    ``fit`` on its share of ``x`` (anything ``model.fit`` takes; :mod:`mpi_trainer.trainer`, docs/keras.md;
    run_dir: written only when given), or a function ``(input_shape, num_outputs) -> keras.Model``, a zoo name
    or ``"package.module:function"``, which every rank builds and then trains the same way. With those, ``x``,
    ``y``: arrays, the same on every rank or None on workers (rank 0's are sent to them), or a pipeline every
    rank builds (dicts per input / output need a ``keras.Model``); without ``x`` the config's ``data.source``.
    ``config``: a TOML path or dict; ``overrides``: dotted ``key=value`` pairs; ``run_dir``: where rank 0
    writes (default: ``launch``'s, else new); a run there resumes, a complete one trains nothing (a
    preemption signal raises ``Preempted``, exit 75).

    Returns a ``keras.callbacks.History`` on every rank (``loss``, ``<metric>``, ``val_*``), with
    ``run_dir``, ``summary`` and ``rounds`` (rounds.csv's numbers) attached; ``model`` then holds the
    final (or restored best) weights on every rank. Bad input raises
    :class:`mpi_trainer.errors.InputError` on every rank before training; an unknown keyword ``TypeError``.
    An error on one rank during the job raises on every rank (:class:`~mpi_trainer.errors.PeerFailure`,
    naming it, on the others); a rank that stops answering ends the job within its wait bound.
    """
    from mpi_trainer.comm.transport import abort_on_error
    from mpi_trainer.launch.fail_together import fail_together
    from mpi_trainer.launch.job import quiet_backend
    from mpi_trainer.launch.keras_args import KerasFitArguments

    quiet_backend()
    overrides = _with_launch_overrides(overrides)
    if _is_keras_model(model):
        return _fit_keras_model(model, dict(
            x=x, y=y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
            validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
            class_weight=class_weight, sample_weight=sample_weight, initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
            validation_batch_size=validation_batch_size, validation_freq=validation_freq),
            config, overrides, run_dir, resume)
    transport = _job_transport()
    keras_args = KerasFitArguments(batch_size, epochs, verbose, shuffle, initial_epoch, steps_per_epoch,
                                   validation_steps, validation_batch_size, validation_freq, validation_split)
    request = FitRequest(model, (x, y, sample_weight, validation_data), keras_args, class_weight,
                         list(callbacks or []), config, overrides)
    # within the job an uncaught error on one rank ends every rank; the script's code after it is its own
    with abort_on_error(transport), _refused_together(transport), fail_together(transport):
        history = _run(transport, request, run_dir, resume)
        transport.release()  # every rank is here: the job's shared window goes with it
        return history


def _left_to_config(kwargs: dict[str, Any], config: Any, overrides: Any) -> None:
    """``fit``'s arguments left out: Keras' defaults, unless the config sets them ("config": the fit reads them
    from it)."""
    from mpi_trainer.launch.keras_args import user_sets

    for name, key, default in (("epochs", "train.epochs", 1), ("batch_size", "train.batch_size", None),
                               ("validation_freq", "evaluation.every", 1)):
        if kwargs[name] is None:
            kwargs[name] = "config" if user_sets(key, config, overrides) else default


def _with_launch_overrides(overrides: Sequence[str] | dict[str, Any] | None) -> list[Any] | None:
    """The script's overrides, then ``launch --set``'s (the flags the user typed last win)."""
    from mpi_trainer.launch.run_dir import launch_overrides

    typed = launch_overrides()
    if not typed:
        return None if overrides is None else _pairs(overrides)
    return _pairs(overrides) + typed


def _is_keras_model(model: Any) -> bool:
    """A ``keras.Model`` object (Keras is imported already: the script built it)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(model, keras.Model)


def _fit_keras_model(model: Any, kwargs: dict[str, Any], config: Any, overrides: Any, run_dir: Any,
                     resume: bool) -> Any:
    """The user's model object: plain ``model.fit`` in one process, else trained by Keras on every worker."""
    from mpi_trainer.comm.transport import abort_on_error
    from mpi_trainer.launch.fail_together import fail_together
    from mpi_trainer.trainer import fit_model, plain_fit

    transport = _job_transport()
    if transport.size == 1:
        if config is not None or overrides or run_dir is not None:
            import warnings

            warnings.warn("mpi_trainer.fit in one process (no mpirun) is plain model.fit: `config`, `overrides` "
                          "and `run_dir` apply to data-parallel jobs only and are ignored here", stacklevel=3)
        return plain_fit(model, {key: value for key, value in kwargs.items() if value is not None})
    _left_to_config(kwargs, config, overrides)
    with abort_on_error(transport), _refused_together(transport), fail_together(transport):
        history = fit_model(transport, model, kwargs, str(config) if isinstance(config, Path) else config,
                            _pairs(overrides), run_dir, resume)
        transport.release()  # every rank is here: the job's shared window goes with it
        return history


def _job_transport() -> Any:
    """A transport on a communicator of its own (what a failed job leaves unread stays there), whose
    waits are bounded from the start by the set-up default (the config may change it)."""
    from mpi_trainer.algorithms.wait_bounds import SETUP_SECONDS, for_rank
    from mpi_trainer.comm import open_transport

    world = open_transport()
    world.bound = for_rank(world.rank, SETUP_SECONDS)
    return world.duplicate()


@dataclass
class FitRequest:
    """What one ``fit`` call asks for, as every rank passed it."""

    model: Any
    data: tuple[Any, Any, Any, Any]  # x, y, sample_weight, validation_data
    keras_args: Any  # keras_args.KerasFitArguments
    class_weight: Any
    callbacks: list[Any]
    config: Any
    overrides: Any


def _run(transport: RankTransport, request: FitRequest, run_dir: Any, resume: bool) -> Any:
    """The History of the fit ``request`` asks for: ``fit(build_fn | zoo name, x, y)`` when ranks passed data
    (:func:`~mpi_trainer.trainer.config_fit.fit_built`), else the config's model on its ``data.source``
    (:func:`~mpi_trainer.trainer.config_fit.fit_config`, the command line's ``train``)."""
    from mpi_trainer.launch.job import agree
    from mpi_trainer.launch.keras_args import fit_overrides
    from mpi_trainer.trainer.config_fit import fit_config

    kinds = transport.allgather(_input_kind(request.data[0], request.data[1]))
    agree(transport, None if len(set(kinds) - {None}) <= 1 else
          f"Every rank passes the same kind of training data (arrays, or a pipeline each rank builds), or None on "
          f"the workers. Received: {', '.join(f'rank {rank}: {kind}' for rank, kind in enumerate(kinds))}")
    if set(kinds) - {None}:
        return _fit_built(transport, request, run_dir, resume)
    args, pairs, error = request.keras_args, [], None
    x, y, sample_weight, validation_data = request.data
    given = {"sample_weight": sample_weight, "validation_data": validation_data,
             "steps_per_epoch": args.steps_per_epoch, "validation_steps": args.validation_steps,
             "validation_batch_size": args.validation_batch_size}
    try:
        for name, value in given.items():
            if value is not None:
                raise ConfigError(f"`{name}` goes with `x`: without `x` the data is the config's `data.source`, "
                                  f"which every rank reads. Received: {name} with x=None; expected x and y, or "
                                  f"{name} left out")
        pairs = fit_overrides(replace(args, validation_freq=args.validation_freq or 1))
        if args.validation_split:
            pairs.append(("data.validation_size", float(args.validation_split)))  # a data.source split at random
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    builder, config, cfg, model_pairs = _model_and_config(transport, request, pairs)
    return fit_config(transport, cfg, config, model_pairs, run_dir, resume, builder, request.callbacks,
                      request.config if isinstance(request.config, (str, Path)) else None, request.class_weight)


def _model_and_config(transport: RankTransport, request: FitRequest,
                      pairs: list[tuple[str, Any]]) -> tuple[Any, Any, Config, list[Any]]:
    """(the builder, the config as passed, the config loaded on every rank, the overrides it was loaded with:
    the script's, then ``pairs``, then the model's name)."""
    from mpi_trainer.launch.job import agree, load_config_everywhere

    builder, overrides, error = None, _pairs(request.overrides) + pairs, None
    try:
        builder, model_pairs = _model_source(request.model)
        overrides += model_pairs
        _check_callbacks(request.callbacks)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    config = str(request.config) if isinstance(request.config, Path) else request.config
    return builder, config, load_config_everywhere(transport, config, overrides), overrides


def _input_kind(x: Any, y: Any) -> str | None:
    """What this rank passed to ``fit(build_fn, ...)``: "arrays", "pipeline" or None (nothing)."""
    from mpi_trainer.data.adapters import is_pipeline

    if is_pipeline(x):
        return "pipeline"
    return None if x is None and y is None else "arrays"


def _fit_built(transport: RankTransport, request: FitRequest, run_dir: Any, resume: bool) -> Any:
    """``fit(build_fn | zoo name, x, y, ...)``: the Keras fit of the model every rank builds
    (:func:`~mpi_trainer.trainer.config_fit.fit_built`)."""
    from mpi_trainer.launch.job import agree
    from mpi_trainer.trainer.config_fit import fit_built

    x, y = request.data[:2]
    structured = [type(value).__name__ for value in (x, y) if isinstance(value, (Mapping, list, tuple))]
    agree(transport, None if not any(transport.allgather(structured)) else
          f"`fit(build_fn, x, y)` builds a model for one input array and one target array. Received: "
          f"{' and '.join(structured) or 'structured inputs on another rank'}; expected arrays, or a keras.Model "
          f"built by the script and passed as `model` (its fit takes inputs and targets by name)")
    builder, config, cfg, pairs = _model_and_config(transport, request, [])
    args = request.keras_args
    arguments = {"batch_size": args.batch_size, "epochs": args.epochs, "verbose": args.verbose,
                 "shuffle": args.shuffle, "initial_epoch": args.initial_epoch, "steps_per_epoch": args.steps_per_epoch,
                 "validation_steps": args.validation_steps, "validation_batch_size": args.validation_batch_size,
                 "validation_freq": args.validation_freq, "validation_split": args.validation_split,
                 "class_weight": request.class_weight, "callbacks": request.callbacks}
    _left_to_config(arguments, request.config, request.overrides)
    return fit_built(transport, cfg, config, pairs, run_dir, resume, builder, request.data, arguments,
                     request.config if isinstance(request.config, (str, Path)) else None)


def _check_callbacks(callbacks: list[Any]) -> None:
    """Refuse, before training, what cannot be a callback on rank 0 (it runs there once an epoch)."""
    import keras

    if not all(isinstance(callback, keras.callbacks.Callback) for callback in callbacks):
        kinds = sorted({type(c).__name__ for c in callbacks if not isinstance(c, keras.callbacks.Callback)})
        raise ConfigError(f"`callbacks` must be keras.callbacks.Callback instances. Received: {kinds}")


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
