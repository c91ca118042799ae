"""``mpi_trainer.fit(model, ...)`` with a ``keras.Model``: the user's object, trained by Keras on every rank.

The steps, on every rank: load the config and place the rank; check what Keras would check
(compiled, the input kinds and arguments, through Keras' own adapters on each worker's share: fit's input
is :mod:`.fit_input`'s), every rank agreeing on a refusal before anything trains; build what the first
batch would build;
lay out the state (:mod:`.state`) and check it is the same everywhere; then rank 0 schedules
(:class:`~.scheduler.SchedulerRounds`) and the workers train (:class:`~.worker.WorkerRounds`). At the
end every rank holds the final state and the same ``keras.callbacks.History``, and its model's
saving methods write whole files (:mod:`.saving`). Run as one process (no ``mpirun``), it is
plain ``model.fit``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.algorithms.divergence import DivergenceWatch
from mpi_trainer.data.adapters import input_kind
from mpi_trainer.data.augmentation import build_augmenter
from mpi_trainer.errors import EXIT_PREEMPTED, ConfigError, InputError, Preempted
from mpi_trainer.launch.agreement import agree, agreed, load_config_everywhere
from mpi_trainer.launch.run_dir import RUN_DIR_ENV
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer import shares
from mpi_trainer.trainer.backup import every_epoch, release_backup, take_backup
from mpi_trainer.trainer.fit_input import (
    Prepared,
    build,
    check_input,
    describe_input,
    full_steps,
    largest_share_steps,
    prepare,
    rounds_an_epoch,
    worker_steps,
)
from mpi_trainer.trainer.outer_choice import choose_outer
from mpi_trainer.trainer.round_protocol import RoundPolicies, StateWire
from mpi_trainer.trainer.run_record import FitRecord, fingerprint
from mpi_trainer.trainer.saving import save_whole_files
from mpi_trainer.trainer.scheduler import SchedulerRounds
from mpi_trainer.trainer.scoring_choice import resolve_place
from mpi_trainer.trainer.settings import given_keys, refusals
from mpi_trainer.trainer.ssp import StaleScheduler, StaleWorker
from mpi_trainer.trainer.state import ModelState, finalize, separate_random_streams
from mpi_trainer.trainer.sync_choice import SyncChoice, not_applicable
from mpi_trainer.trainer.synchronous import GradientSum, check_synchronous
from mpi_trainer.trainer.worker import WorkerPart, WorkerRounds

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport
    from mpi_trainer.config import Config

ARGUMENT_KEYS = ("batch_size", "epochs", "shuffle", "class_weight", "initial_epoch", "steps_per_epoch",
                 "validation_split", "validation_steps", "validation_batch_size", "validation_freq")


def plain_fit(model: Any, kwargs: dict[str, Any]) -> Any:
    """One process: Keras' own ``fit``, exactly as the script would call it."""
    return model.fit(**kwargs)


def fit_model(transport: RankTransport, model: Any, kwargs: dict[str, Any], config: Any, overrides: list[Any],
              run_dir: Any, resume: bool, applied: Collection[str] = (), describe: dict[str, Any] | None = None) -> Any:
    """The data-parallel fit of ``model`` on this rank (see the module docstring); returns its History.

    ``applied``: the config keys the caller applied before (:mod:`.config_fit`: the model and data it built);
    ``describe``: what the caller adds to summary.json."""
    from mpi_trainer.launch.job import start_rank

    cfg = load_config_everywhere(transport, config, overrides)
    cfg, placements = start_rank(transport, cfg)
    cfg = wire_for(transport, cfg)
    cfg, scoring_why = resolve_place(cfg, placements)
    if transport.rank == 0:
        get_logger().info("%s", scoring_why)
    cfg.test_hooks.freeze_at(transport.rank, -1)  # debug.freeze_rank with freeze_round = -1: stops during set-up
    for name in ("epochs", "batch_size"):  # left to the config by the caller
        if kwargs.get(name) == "config":
            kwargs[name] = getattr(cfg.train, name)
    if kwargs.get("validation_freq") == "config":
        kwargs["validation_freq"] = scored_epochs(cfg.evaluation.every, kwargs.get("epochs") or 1)
    workers = transport.size - 1
    prepared, error, backup = None, None, None
    try:
        kwargs, run_dir, backup = take_backup(kwargs, run_dir)  # the script's BackupAndRestore: the run's checkpoints
        cfg = every_epoch(cfg, backup)
        check_optimizers(model)
        if cfg.aggregation.synchronous:
            check_synchronous(model)
        check_config(cfg, run_dir, resume, given_keys(config, overrides), applied)
        cfg.test_hooks.check_slow_ranks(transport.size)  # debug.slow_ranks: worker ranks of this job
        check_backend()
        check_input(cfg, kwargs)
        check_early_stopping(cfg, kwargs)
        prepared = prepare(model, kwargs, transport.rank, workers, cfg.evaluation.on_workers, cfg.aggregation.elects)
        if cfg.model.uses_lbfgs:
            from mpi_trainer.trainer.lbfgs import lbfgs_refusal

            refused = lbfgs_refusal(prepared.train_data, kwargs)
            if refused:
                raise ConfigError(refused)
    except (InputError, ValueError, TypeError) as exc:  # Keras' refusals are ValueError / TypeError
        error = str(exc)
    agree(transport, error)
    prepared = agreed(prepared)
    if backup is not None:
        describe = {**(describe or {}), "backup_and_restore": str(backup.directory)}
        if transport.rank == 0:
            get_logger().info("%s", backup.describe())
    build(model, kwargs, prepared)
    if transport.rank > 0:  # each worker its own masks and noise, the first the script's
        separate_random_streams(model, transport.rank - 1)
    workers_only = transport.split_workers() if cfg.aggregation.synchronous else None  # every rank takes part
    state = ModelState(model, cfg.aggregation.local_optimizer_state)
    layouts = transport.allgather((state.size, len(state.integers)))
    agree(transport, None if len(set(layouts)) == 1 else
          f"Every rank must hold the same model. Received state sizes (values, integer variables) {layouts}; "
          f"expected the same on every rank (build the model the same way on every rank)")
    record, saved, error = None, None, None
    if transport.rank == 0:
        try:
            record = make_record(model, kwargs, cfg, prepared, run_dir, placements,
                                 {"model_bytes": state.nbytes, **(describe or {})})
            saved = extended(record.open(), kwargs.get("epochs") or 1, cfg.train.max_steps)
        except (InputError, OSError) as exc:
            error = str(exc)
    agree(transport, error)
    preemption = Preemption()  # a signal noted here; the epoch it ends checkpoints, every rank exits 75
    preemption.install(cfg.checkpoint.preempt_signals, cfg.checkpoint.grace_seconds,
                       lambda: transport.abort(EXIT_PREEMPTED))
    try:
        if cfg.model.uses_lbfgs:  # full-batch L-BFGS: its own iterations, the same record and callbacks
            history = fit_lbfgs(transport, model, state, kwargs, cfg, prepared, record, saved, placements,
                                preemption)
        elif transport.rank == 0:
            history = schedule(transport, model, state, kwargs, cfg, prepared, agreed(record), saved, placements,
                               preemption)
        else:
            def reshared() -> WorkerPart:  # fault.survive, after a loss: this worker's part by its new rank
                return worker_part(prepare(model, kwargs, transport.rank, transport.size - 1,
                                           cfg.evaluation.on_workers, cfg.aggregation.elects), cfg)

            part = worker_part(prepared, cfg)
            worker = (StaleWorker if cfg.aggregation.ssp else WorkerRounds)(
                transport, model, state, part.share, part.rows, cfg.aggregation.weighs_by_samples, wait_bounds(cfg),
                gradients=None if workers_only is None else GradientSum(workers_only, model), part=part,
                preemption=preemption, wire=StateWire(cfg.aggregation.wire_dtype, state.model_size),
                augmenter=build_augmenter(cfg.data.augmentation, cfg.train.seed + transport.rank),
                reshare=reshared if cfg.fault.survive else None, test_hooks=cfg.test_hooks)
            worker.run()
            history = None
    finally:
        preemption.uninstall()
    history = finish(transport, model, history)
    release_backup(backup, history.summary, transport.rank)
    return history


# Optimizers whose state a data-parallel fit does not yet carry as one process would, even on one worker
# (docs/keras.md's table): refused by name before training rather than trained silently wrong.
UNSUPPORTED_OPTIMIZERS = {
    "ScheduleFreeAdamW": "its interpolation between the gradient sequence and the averaged one, which a round "
                         "would have to carry over, is not reproduced: even one worker ends far from one process",
}


def check_optimizers(model: Any) -> None:
    """Refuse an optimizer of :data:`UNSUPPORTED_OPTIMIZERS`, naming it and why."""
    from mpi_trainer.trainer.state import model_optimizers

    for optimizer in model_optimizers(model):
        inner = getattr(optimizer, "inner_optimizer", None) or optimizer
        why = UNSUPPORTED_OPTIMIZERS.get(type(inner).__name__)
        if why is not None:
            raise ConfigError(f"A data-parallel fit cannot train with keras.optimizers.{type(inner).__name__}: "
                              f"{why}. Received: optimizer={type(inner).__name__}; expected another Keras "
                              f"optimizer (docs/keras.md lists each one's row)")


def wire_for(transport: RankTransport, cfg: Config) -> Config:
    """``aggregation.wire_dtype = "auto"`` resolved: timed on the job's own links (under SSP, whose states
    travel point to point in float32, float32)."""
    from mpi_trainer.launch.wire_choice import resolve_wire

    if cfg.aggregation.ssp and cfg.aggregation.wire_dtype_auto:
        return dataclasses.replace(cfg, aggregation=dataclasses.replace(cfg.aggregation, wire_dtype="float32"))
    return resolve_wire(transport, cfg)


def scored_epochs(every: int, epochs: int) -> int | list[int]:
    """``evaluation.every = n`` as Keras' ``validation_freq``: every n-th epoch and the last (1: every epoch)."""
    if every <= 1:
        return 1
    return sorted({*range(every, epochs + 1, every), epochs})


def extended(saved: dict[str, Any] | None, epochs: int, max_steps: int) -> dict[str, Any] | None:
    """A complete run that ended on its epochs (or max_steps) goes on when more are asked for now."""
    from mpi_trainer.persistence.run_state import more_to_train

    if saved is None or not saved["complete"]:
        return saved
    steps = sum(int(float(row.get("steps") or 0)) for row in saved["rows"])
    summary = {"stop_reason": saved["stop_reason"], "rounds_completed": saved["next_epoch"], "steps": steps}
    return {**saved, "complete": False} if more_to_train(summary, epochs, max_steps) else saved


def worker_part(prepared: Prepared, cfg: Config) -> WorkerPart:
    """A worker's part of the fit: its share of the rows, its validation rows (to score, or to stand for
    election with), with ``data.increment`` the rows its draws come from, with ``data.rebalance`` the order
    rows are dealt in."""
    data = prepared.train_data
    increment = (data, prepared.fixed_rows, cfg.data.increment) if cfg.data.increment.enabled else None
    dealt = ((data, shares.dealing_order(shares.row_count(data), prepared.share.get("shuffle", True)))
             if cfg.data.rebalance else None)
    return WorkerPart(prepared.share, prepared.rows, prepared.validation, prepared.election, increment, dealt)


def check_config(cfg: Config, run_dir: Any, resume: bool, given: Collection[str] = (),
                 applied: Collection[str] = ()) -> None:
    """Refuse every setting this fit would not apply (:mod:`.settings`), each named with its value.

    ``given``: the keys the script set (:func:`.settings.given_keys`), so that a key this fit does not
    read is refused even at its default value (``log.tensorboard = true``); without them, a key is
    refused when its value differs from the default.
    """
    has_run_dir = run_dir is not None or bool(os.environ.get(RUN_DIR_ENV))
    problems = refusals(cfg, given, has_run_dir, applied)
    if problems:
        raise ConfigError("\n".join(problems))
    if resume and not has_run_dir:
        raise ConfigError("`resume=True` needs the run directory to continue. Received: run_dir=None; "
                          "expected the run_dir of an earlier fit")


def check_early_stopping(cfg: Config, kwargs: dict[str, Any]) -> None:
    """``early_stopping.patience`` watching held-out rows needs the fit's validation data."""
    settings = cfg.early_stopping
    held_out = kwargs.get("validation_data") is not None or bool(kwargs.get("validation_split"))
    if settings.patience and not settings.monitor.startswith("train_") and not held_out:
        raise ConfigError(f"`early_stopping.monitor` = {settings.monitor!r} watches the held-out rows, and this fit "
                          f"holds none out. Received: early_stopping.patience={settings.patience} with "
                          f"validation_data=None and validation_split={kwargs.get('validation_split')!r}; expected "
                          f"validation_data or validation_split, or a train_* monitor")


def early_stopping(cfg: Config) -> list[Any]:
    """``early_stopping.patience > 0``: Keras' own EarlyStopping among rank 0's callbacks, watching the config's
    monitor (``test_*`` and ``val_*``: the fit's validation data; ``train_*``: the training logs), restoring
    the best weights at the end as the command line keeps them. A monitor the logs never hold is named."""
    import keras

    from mpi_trainer.algorithms.early_stopping import minimised

    settings = cfg.early_stopping
    if not settings.patience:
        return []
    split, name = settings.monitor.split("_", 1)
    monitor = name if split == "train" else f"val_{name}"
    mode = settings.mode if settings.mode != "auto" else ("min" if minimised(settings.monitor) else "max")

    class Watched(keras.callbacks.EarlyStopping):
        def get_monitor_value(self, logs: Any) -> Any:
            logs = logs or {}
            scored = split == "train" or any(key.startswith("val_") for key in logs)
            if scored and self.monitor not in logs:  # else an epoch validation_freq does not score
                raise ConfigError(f"`early_stopping.monitor` = {settings.monitor!r} watches {self.monitor!r}, which "
                                  f"the epoch's logs do not hold. Received logs: {sorted(logs)}; expected a "
                                  f"metric the model was compiled with")
            return super().get_monitor_value(logs)

    return [Watched(monitor=monitor, patience=settings.patience, min_delta=settings.min_delta, mode=mode,
                    restore_best_weights=True)]


def sync_choice_for(cfg: Config, kwargs: dict[str, Any], prepared: Prepared, workers: int,
                    record: FitRecord) -> SyncChoice | None:
    """``train.sync_every = "auto"``: the choice rank 0 makes from the second round, or None (the setting's
    steps) where it is not ``"auto"``, or where this fit trains whole epochs only (said in the log)."""
    if not cfg.train.sync_auto:
        return None
    why = not_applicable(input_kind(kwargs.get("x")), kwargs.get("steps_per_epoch"), cfg.aggregation.ssp,
                         cfg.data.increment.enabled, cfg.data.rebalance, cfg.train.max_steps)
    if why is not None:
        record.log.info("train.sync_every = auto: one round per epoch (%s)", why)
        return None
    return SyncChoice(largest_share_steps(kwargs, prepared, workers))


def check_backend() -> None:
    """``KERAS_BACKEND`` set after Keras started is not the backend in use: say so instead of ignoring it."""
    import keras

    asked = os.environ.get("KERAS_BACKEND")
    if asked and asked != keras.backend.backend():
        raise ConfigError(f"Keras runs on {keras.backend.backend()!r} but KERAS_BACKEND={asked!r}: Keras reads it "
                          f"once, when it is first imported (mpi_trainer.init() or an earlier import started it). "
                          f"Received: KERAS_BACKEND={asked!r}; expected it set before anything imports Keras")


def arguments_print(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: kwargs.get(key) for key in ARGUMENT_KEYS if kwargs.get(key) is not None}


def wait_bounds(cfg: Config) -> Any:
    from mpi_trainer.algorithms.wait_bounds import WaitBounds

    return WaitBounds(cfg.watchdog.setup_timeout, cfg.watchdog.worker_timeout)


def make_record(model: Any, kwargs: dict[str, Any], cfg: Config, prepared: Prepared, run_dir: Any,
                placements: list[Any], extra: dict[str, Any] | None = None) -> FitRecord:
    """Rank 0's record of this fit, in ``run_dir`` (or ``launch``'s), or kept in memory only."""
    path = run_dir if run_dir is not None else os.environ.get(RUN_DIR_ENV)
    workers = len(placements) - 1
    describe = {"aggregation": cfg.aggregation.method, "ssp": cfg.aggregation.ssp,
                "outer_optimizer": outer_for(cfg, model, workers)[0],
                "placement": [placement.as_dict() for placement in placements], **(extra or {})}
    return FitRecord(None if path is None else Path(path),
                     fingerprint(model, prepared.train_data, arguments_print(kwargs), cfg.to_dict()), describe,
                     cfg.checkpoint.every, cfg.checkpoint.every_seconds, cfg.to_toml(), cfg.log.tensorboard,
                     cfg.log.plots, cfg.log.timeline)


def outer_for(cfg: Config, model: Any, workers: int) -> tuple[str, str]:
    """The outer optimizer this fit takes, and why (:mod:`.outer_choice`)."""
    return choose_outer(cfg.outer_optimizer_for(workers), cfg.aggregation.outer_optimizer_auto, model)


def schedule(transport: RankTransport, model: Any, state: ModelState, kwargs: dict[str, Any], cfg: Config,
             prepared: Prepared, record: FitRecord, saved: dict[str, Any] | None, placements: list[Any],
             preemption: Preemption | None = None) -> Any:
    """Rank 0's whole fit: the epochs and the callbacks, recorded; returns the History."""

    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings

    workers = len(placements) - 1

    outer_name, outer_why = outer_for(cfg, model, workers)
    outer = OuterOptimizer(dataclasses.replace(OuterSettings.from_config(cfg, workers), name=outer_name))
    epochs = kwargs.get("epochs", 1)
    callbacks = callback_list(kwargs, cfg, model, worker_steps(kwargs, prepared, workers))
    policies = round_policies(cfg, model, state, kwargs, prepared, workers, record, preemption)
    arguments = (transport, model, state, outer, callbacks, prepared.validation, kwargs.get("validation_freq", 1),
                 record, wait_bounds(cfg), policies)
    aggregation = cfg.aggregation
    rounds = SchedulerRounds(*arguments) if not aggregation.ssp else StaleScheduler(
        *arguments, ssp=aggregation.ssp, damping=aggregation.staleness_damping, weighted=aggregation.weighs_by_samples)
    with recorded_run(transport, record, saved, placements, state) as (first, complete):
        record.log.info("state: %s; %s: %s", state.describe(), outer.settings.describe(), outer_why)
        if cfg.aggregation.synchronous:
            record.log.info("synchronous SGD: at every step the workers' gradients are summed (weighted by their "
                            "batches' rows) and every worker applies the same update; at each epoch's end one "
                            "worker's state, which all hold, goes to rank 0")
        record.log.info("fit: %s; %s", describe_input(prepared.train_data, workers,
                                                      worker_steps(kwargs, prepared, workers)),
                        scoring_place(cfg, prepared))
        if saved is not None:
            outer.load_state(saved["outer"], state.trainable_size)  # the outer step's momentum goes on too
        if complete:  # its callbacks ran when it trained; the workers take its final state, its files stay
            rounds.send_stop()
        else:
            rounds.run(kwargs.get("initial_epoch", 0) if first is None else first, epochs)
        return closed_history(transport, model, state, callbacks, record, complete, rounds.preempted,
                              rounds.kept_arrays())


@contextmanager
def recorded_run(transport: RankTransport, record: FitRecord, saved: dict[str, Any] | None, placements: list[Any],
                 state: ModelState) -> Iterator[tuple[int | None, bool]]:
    """Rank 0's start, resume and close, whatever the way of training: the run record begun (a resumed run's
    rows and history taken back), the set-up's bytes counted, the ranks' placements logged, a saved state
    written back into the model; yields (the epoch a resumed run goes on from, None for a new one; whether the
    run was complete); the record released at the end, however the fit ends."""
    from mpi_trainer.launch.process_placement import log_placements

    try:
        record.begin(saved)
        record.count_bytes(transport.take_bytes())  # the set-up's (scattered data): the run's, not an epoch's
        log_placements(placements)
        if saved is not None:
            state.write(saved["state"])
            state.write_integers(saved["integers"])
        yield (saved["next_epoch"] if saved else None), bool(saved and saved["complete"])
    finally:
        record.release()


def round_policies(cfg: Config, model: Any, state: ModelState, kwargs: dict[str, Any], prepared: Prepared,
                   workers: int, record: FitRecord, preemption: Preemption | None) -> RoundPolicies:
    """What the config asks of the scheduler's rounds, whole."""
    from mpi_trainer.algorithms.rebalance import Rebalancer

    train, aggregation = cfg.train, cfg.aggregation
    choice = sync_choice_for(cfg, kwargs, prepared, workers, record)
    rows = shares.row_count(prepared.train_data) if cfg.data.rebalance else 0
    return RoundPolicies(
        workers_score=prepared.workers_score, elects=aggregation.elects, synchronous=aggregation.synchronous,
        overlap=train.overlap_eval, wire=StateWire(aggregation.wire_dtype, state.model_size),
        sync_choice=choice,
        sync_every=lambda epoch: (train.sync_warmup_every if epoch < train.sync_warmup_epochs
                                  else choice.every if choice is not None else train.sync_steps),
        plan_parts=lambda survivors, every: rounds_an_epoch(every, kwargs, prepared, survivors),
        preemption=preemption, nan_policy=train.nan_policy,
        rebalancer=Rebalancer(shares.even_bounds(rows, workers), cfg.data.rebalance_smoothing)
        if cfg.data.rebalance else None,
        max_steps=train.max_steps, full_steps=full_steps(kwargs, prepared, workers) if train.max_steps else [],
        divergence=DivergenceWatch(train.divergence_rounds, output_classes(model)) if train.watches_divergence
        else None,
        stops_on_divergence=train.watches_divergence and train.stops_on_divergence,
        fault=cfg.fault if cfg.fault.survive else None, test_hooks=cfg.test_hooks)


def fit_lbfgs(transport: RankTransport, model: Any, state: ModelState, kwargs: dict[str, Any], cfg: Config,
              prepared: Any, record: FitRecord | None, saved: dict[str, Any] | None, placements: list[Any],
              preemption: Preemption) -> Any:
    """This rank's part of an L-BFGS fit: rank 0 returns the History, a worker None."""
    from mpi_trainer.trainer.lbfgs import LbfgsScheduler, LbfgsWorker

    workers = transport.size - 1
    if transport.rank != 0:
        LbfgsWorker(transport, model, state, prepared.share, cfg.lbfgs.batch_size).run()
        return None
    assert record is not None
    rows = shares.row_count(prepared.train_data)
    callbacks = callback_list(kwargs, cfg, model, 1)
    with recorded_run(transport, record, saved, placements, state) as (first, complete):
        record.log.info("fit: %s; %s", describe_input(prepared.train_data, workers, None), scoring_place(cfg, prepared))
        blocks = [len(shares.share_rows(rows, workers, index, kwargs.get("shuffle", True))) for index in range(workers)]
        before = int(float(record.rows[-1].get("function_evaluations") or 0)) if record.rows else 0
        scheduler = LbfgsScheduler(transport, model, state, cfg, callbacks, prepared.validation,
                                   kwargs.get("validation_freq", 1), record, rows, preemption, blocks, before)
        first = first or 0
        scheduler.run(first, first if complete else kwargs.get("epochs") or 1)
        return closed_history(transport, model, state, callbacks, record, complete, scheduler.preempted)


def callback_list(kwargs: dict[str, Any], cfg: Config, model: Any, steps: int | None) -> Any:
    """Rank 0's callbacks as Keras' fit runs them: the script's, then the config's early stopping, with the
    History and (unless ``verbose=0``) the progress bar."""
    import keras

    verbose = kwargs.get("verbose", "auto")
    return keras.callbacks.CallbackList(list(kwargs.get("callbacks") or []) + early_stopping(cfg), add_history=True,
                                        add_progbar=verbose != 0, verbose=verbose, epochs=kwargs.get("epochs", 1),
                                        steps=steps, model=model)


def closed_history(transport: RankTransport, model: Any, state: ModelState, callbacks: Any, record: FitRecord,
                   complete: bool, preempted: bool = False, outer: dict[str, np.ndarray] | None = None) -> Any:
    """The end of rank 0's fit: the final state (and the outer optimizer's, ``outer``: a run asked for more
    epochs goes on with its momentum) saved and summary.json written; the History returned (a preempted
    fit, checkpointed after its last epoch, raises :class:`Preempted` as its workers leave)."""
    # what rank 0 spent waiting on the workers (polling sleeps between tests: comm.poll_interval), and the CPU
    # it burnt meanwhile, a fraction of one core
    waited = transport.wait_wall_seconds
    record.describe.update(scheduler_wait_seconds=waited,
                           scheduler_wait_cpu_fraction=transport.wait_cpu_seconds / waited if waited > 0 else 0.0)
    if preempted:
        record.finish(transport.size - 1)
        raise Preempted()
    history = _history(callbacks, record, trained=not complete)
    if not complete:  # the state to train on from (before the EMA is written), then the final model
        record.save_state(state.read(state.empty()), state.read_integers(), len(history.epoch), history, True,
                          outer)
    finalize(model)
    if not complete:
        record.save_weights(model)
    history.summary = record.finish(transport.size - 1)  # the survivors, under fault.survive
    history.rounds = record.columns()
    history.run_dir = record.path
    return history


def output_classes(model: Any) -> int | None:
    """The classes a single-output classifier scores (its last dimension; 2 for one sigmoid), for the
    divergence watch's chance level; None when the model has no single output to read it from."""
    outputs = getattr(model, "outputs", None) or []
    if len(outputs) != 1 or outputs[0].shape[-1] is None:
        return None
    return max(2, int(outputs[0].shape[-1]))


def scoring_place(cfg: Config, prepared: Prepared) -> str:
    """Where the validation data is scored, for the log."""
    if prepared.validation is None:
        return "no validation data"
    if cfg.aggregation.elects:
        return ("best-of: each worker scores its own state on the validation data, the best is kept and its "
                "scores are the epoch's")
    if prepared.workers_score:
        return "validation data scored by the workers, each on its share, their metric states summed on rank 0"
    if cfg.evaluation.on_workers:
        return ("validation data scored on rank 0: evaluation.where = \"workers\" shares validation arrays of a "
                "row a worker or more, without validation_steps")
    if cfg.train.overlap_eval:
        return "validation data scored on rank 0 while the workers train the next epoch (train.overlap_eval)"
    return "validation data scored on rank 0"


def _history(callbacks: Any, record: FitRecord, trained: bool) -> Any:
    """The fit's History: a resumed run's earlier epochs, then this job's (none: a complete run found again)."""
    import keras

    history = next(c for c in callbacks.callbacks if isinstance(c, keras.callbacks.History))
    if not trained:
        history.on_train_begin()  # what training begins (its epoch list) when no epoch runs
    merged = record.merged(history)
    history.history, history.epoch = merged.history, merged.epoch
    return history


def finish(transport: RankTransport, model: Any, history: Any) -> Any:
    """Every rank's History (rank 0's), its model already holding the final state; saving made safe."""
    import keras

    outcome = None if history is None else {
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
        "epoch": list(history.epoch), "params": dict(history.params or {}), "summary": history.summary,
        "rounds": history.rounds,
        "run_dir": None if history.run_dir is None else str(history.run_dir)}
    outcome = transport.bcast_object(outcome)
    if transport.rank != 0:
        finalize(model)  # rank 0's was, before its final weights were saved
    if history is None:
        history = keras.callbacks.History()
        history.set_model(model)
        history.history, history.epoch = outcome["history"], outcome["epoch"]
        history.set_params(outcome["params"])
        history.summary, history.rounds = outcome["summary"], outcome["rounds"]
        history.run_dir = None if outcome["run_dir"] is None else Path(outcome["run_dir"])
    model.history = history  # as Keras' fit leaves it; rank 0's History set it only if an epoch ran
    save_whole_files(model)
    return history
