"""Which config settings a fit of a ``keras.Model`` applies; every other one set is refused, never ignored.

A ``keras.Model`` trains with Keras' own machinery: the optimizer, loss and metrics it was compiled
with, ``fit``'s arguments, the callbacks the script passes. Part of the config describes the model
and data that a model given by name or as a function is built from and compiled with. Every key of
the config is classified here:
:data:`HONOURED` (this path reads it; each entry says where) or :data:`NOT_APPLIED` (each entry says
what a Keras script does instead). A key this path does not apply is refused before training when
its value differs from the default, or when the script sets it at all (:func:`given_keys`), unless
the value is :data:`AS_DONE`: the value that says what this path does anyway (``log.tensorboard =
false``, ``train.max_steps = 0``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from mpi_trainer import hooks
from mpi_trainer.config import Config, all_keys, parse_override, read_toml
from mpi_trainer.config.choices import DEFAULT_VALIDATION_SIZE
from mpi_trainer.config.rules import needs_validation

PLACEMENT = "each rank's device, threads and cores, placed before training (mpi_trainer.init() or fit)"
WAITS = "how long a rank waits for its peers before it names them and ends the job"
OUTER = "the outer step from each epoch's combined state (docs/outer-optimizer.md)"
CHECKPOINT = "how often rank 0 saves checkpoint.h5 in the run directory (a run_dir, or launch's)"
PREEMPTION = "a signal named here ends the job after the current epoch with a checkpoint, exit 75 on every rank"

HONOURED: dict[str, str] = {
    "train.epochs": "fit's `epochs` when the call leaves it out (the argument wins)",
    "train.batch_size": "fit's `batch_size` when the call leaves it out (the argument wins)",
    "train.device": PLACEMENT,
    "train.scheduler_device": PLACEMENT,
    "train.threads": PLACEMENT,
    "train.bind_cores": PLACEMENT,
    "aggregation.method": "how the workers' states are combined: 'average', 'weighted' by rows, 'best' (each "
                          "worker scores its state on the validation data, the best is kept), or 'synchronous' "
                          "(synchronous SGD: the gradients summed at every step)",
    "aggregation.wire_dtype": "the dtype the model's variables travel in each round: float32, or float16 / bfloat16 "
                              "(half the bytes; sums stay float32 on rank 0, the optimizers' variables travel as "
                              "float32, and scoring on the workers takes the state exactly); 'auto' times the job's "
                              "links at its start",
    "aggregation.optimizer_state": "'combined': the optimizers' moments travel each round and are combined by "
                                   "their meaning; 'local': each worker keeps its own (only the model's state, "
                                   "the learning rates and an EMA travel)",
    "aggregation.outer_optimizer": OUTER,
    "aggregation.outer_learning_rate": OUTER,
    "aggregation.outer_momentum": OUTER,
    "aggregation.outer_beta_1": OUTER,
    "aggregation.outer_beta_2": OUTER,
    "aggregation.outer_epsilon": OUTER,
    "checkpoint.every": CHECKPOINT,
    "checkpoint.every_seconds": CHECKPOINT,
    "comm.poll_interval": "how long a waiting rank sleeps between polls of its pending messages",
    "watchdog.setup_timeout": WAITS,
    "watchdog.worker_timeout": WAITS,
    "log.verbosity": "mpi_trainer's own log on the console (Keras' progress bar follows fit's `verbose`)",
    "watchdog.stall_seconds": "the stall bound of `launch`, which watches the run's rounds.csv when it supervises "
                              "the script",
    "train.sync_every": "k > 0: the workers' states are combined every k steps of their rows (arrays), "
                        "each epoch in ceil(steps / k) rounds; 0: once an epoch; \"auto\": k chosen from the first "
                        "round's cost against a step's",
    **dict.fromkeys(("train.sync_warmup_epochs", "train.sync_warmup_every"),
                    "a warm-up: the first n epochs combine the workers every `sync_warmup_every` steps of their rows "
                    "(arrays), then train.sync_every applies"),
    **dict.fromkeys(("data.augmentation.enabled", "data.augmentation.shift", "data.augmentation.rotation",
                     "data.augmentation.zoom", "data.augmentation.flip"),
                    "each round, each worker trains on a freshly transformed copy of its images (Keras' random "
                    "translation, rotation, zoom and flip layers); x: one array of (height, width, channels) "
                    "images; validation and scoring see them as they are"),
    **dict.fromkeys(("data.rebalance", "data.rebalance_smoothing"),
                    "after each epoch the workers' blocks of the training arrays are re-cut in proportion to their "
                    "rows a second (the median of the last 3 epochs, smoothed by rebalance_smoothing); a fast "
                    "worker trains more rows (arrays, whole epochs)"),
    "checkpoint.preempt_signals": PREEMPTION,
    "checkpoint.grace_seconds": PREEMPTION,
    **dict.fromkeys(("data.increment.enabled", "data.increment.load_factor", "data.increment.absolute_factor",
                     "data.increment.min_gap"),
                    "each epoch a worker trains its own rows plus a seeded draw of the others' (arrays, whole epochs)"),
    "aggregation.ssp": "s > 0: each worker's epoch is merged as it arrives, a worker at most s epochs ahead of "
                       "the slowest; every W merged updates close an epoch (docs/keras.md)",
    "aggregation.staleness_damping": "under SSP: an update's share divided by 1 + its staleness",
    **dict.fromkeys(("early_stopping.patience", "early_stopping.min_delta", "early_stopping.monitor",
                     "early_stopping.mode"),
                    "patience > 0: keras.callbacks.EarlyStopping on rank 0 watching the monitor (test_* and val_*: "
                    "the validation data), the best weights restored at the end"),
    "log.tensorboard": "rank 0 writes each epoch's row of rounds.csv as TensorBoard scalars in RUN_DIR/tensorboard",
    "log.plots": "rank 0 writes report.txt and the plots in the run directory at the end, as the command line's",
    "log.timeline": "rank 0 writes timeline.json: each worker's training and rank 0's waiting, combining, scoring "
                    "and checkpoint an epoch, as a Chrome trace",
    "train.max_steps": "the workers' steps, summed, after which the fit stops: the last epoch's steps dealt out to "
                       "them (arrays or steps_per_epoch, whole epochs)",
    "train.nan_policy": "a round whose loss or combined state is not finite: 'stop' ends the fit with the state "
                        "before it, 'rollback' trains it again from there at half the learning rate",
    **dict.fromkeys(("train.divergence", "train.divergence_rounds"),
                    "a finite divergence (the loss above its first epoch's, the accuracy at chance) over the epochs' "
                    "rows: 'warn' logs it and keeps it in summary.json, 'stop' also ends the fit"),
    "fault.survive": "a lost worker's epoch starts again with the survivors, each on its share for them "
                     "(needs fault-tolerant MPI: launch, or mpirun --with-ft ulfm)",
    "fault.min_workers": "with fault.survive: fewer workers than this checkpoint and end the job for launch",
    "train.overlap_eval": "the next epoch's first round is handed out before an epoch is scored, so the workers "
                          "train while rank 0 scores and runs the callbacks; what a callback sets (a learning "
                          "rate, stop_training) takes effect a round later, and a round trained past the fit's "
                          "stop is dropped (docs/keras.md)",
    "evaluation.every": "n > 1: fit's `validation_freq` when the call leaves it out: the validation data is scored "
                        "every n-th epoch and after the last",
    "evaluation.where": "'workers': each worker scores its shard of the validation data with the combined state, "
                        "and their metric states are summed on rank 0; 'auto' (the default): so where every "
                        "worker is on a GPU, rank 0 alone otherwise (docs/keras.md)",
}

# What a Keras script does instead of each key a keras.Model does not apply.
DATA = "a keras.Model trains on the `x` and `y` the script passes; hold rows out with `validation_split` or " \
       "`validation_data`"
COMPILED = "a keras.Model trains with the optimizer, loss and metrics it was compiled with"

NOT_APPLIED: dict[str, str] = {
    **dict.fromkeys(("data.source", "data.test_size", "data.validation_size", "data.label", "data.features",
                     "data.datasets", "data.stream", "data.image_size", "data.color_mode", "data.feature_shape",
                     "data.feature_dtype", "data.placement"), DATA),
    **dict.fromkeys(("model.name", "model.optimizer", "model.learning_rate", "model.activation", "model.loss",
                     "model.metrics", "lbfgs.history_size", "lbfgs.gtol", "lbfgs.ftol", "lbfgs.max_evaluations",
                     "lbfgs.batch_size"), COMPILED),
    "train.shuffle": "pass `shuffle=False` to fit",
    "train.seed": "seed the script itself (keras.utils.set_random_seed) before it builds the model",
}

# Values of keys in NOT_APPLIED that say what this path does anyway: accepted even when set.
AS_DONE: dict[str, Any] = {
    "data.placement": "shared", "data.test_size": 0.0, "data.validation_size": 0.0,
}


def value_of(cfg: Config, key: str) -> Any:
    """The value of a dotted key, e.g. ``value_of(cfg, "train.max_steps")``."""
    value: Any = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _dotted(table: Any, prefix: str = "") -> set[str]:
    """The dotted keys a (nested) table sets: ``{"log": {"plots": False}}`` -> ``{"log.plots"}``."""
    if not isinstance(table, dict):
        return {prefix.rstrip(".")}
    return {key for name, value in table.items() for key in _dotted(value, f"{prefix}{name}.")}


def given_keys(config: Any, overrides: Iterable[Any] | dict[str, Any] | None) -> set[str]:
    """The config keys the script sets: in ``config`` (a TOML path or a dict of sections) and in
    ``overrides`` (``"key=value"`` strings, ``(key, value)`` pairs or a dict), the test hooks left out."""
    table = read_toml(config) if isinstance(config, (str, Path)) else config or {}
    keys = _dotted({name: value for name, value in table.items() if name != hooks.PREFIX})
    pairs = overrides.items() if isinstance(overrides, dict) else overrides or []
    for item in pairs:
        key, value = parse_override(item) if isinstance(item, str) else item
        keys |= {key} if not isinstance(value, dict) else _dotted(value, f"{key}.")
    return {key for key in keys if key and key.split(".")[0] != hooks.PREFIX}


def _applied(key: str, value: Any, default: Any, given: bool) -> bool:
    """Whether a key this path does not read can pass: left at its default, or saying what happens anyway."""
    if key in AS_DONE and value == AS_DONE[key]:
        return True
    return value == default and not given


def _derived(cfg: Config, key: str, given: Collection[str]) -> bool:
    """A value the loader filled in from another key (which is refused in its own right)."""
    return (key == "data.validation_size" and key not in given and needs_validation(cfg)
            and cfg.data.validation_size == DEFAULT_VALIDATION_SIZE)


def _expected(key: str, value: Any, default: Any) -> str:
    if key in AS_DONE and AS_DONE[key] != default:
        return f"{AS_DONE[key]!r}, or the key left out"
    return f"the default {default!r}" if value != default else "the key left out"


def refusal(key: str, value: Any, default: Any) -> str:
    """Why ``key`` cannot be set when ``model`` is a keras.Model, and what the Keras way is instead."""
    received = f"Received: {key}={value!r}; expected {_expected(key, value, default)}"
    instead = NOT_APPLIED.get(key, "nothing on this path reads it")
    return (f"`{key}` is not applied when `model` is a keras.Model: it applies to models given by name or as a "
            f"function (the command line's `train`, or `mpi_trainer.fit(build_fn, ...)`); {instead}. {received}")


def _run_dir_refusal(cfg: Config, given: Collection[str]) -> str | None:
    """Checkpoints, TensorBoard's events and the plots go to the run directory; a fit that has none would not
    write them."""
    defaults = Config()
    for key in ("checkpoint.every", "checkpoint.every_seconds", "log.tensorboard", "log.plots", "log.timeline"):
        value = value_of(cfg, key)
        if value and (value != value_of(defaults, key) or key in given):
            return (f"`{key}` writes into the run directory, and this fit has none. Received: "
                    f"{key}={value!r} with run_dir=None; expected a `run_dir` (or `launch`'s), or "
                    f"{key}={'false' if isinstance(value, bool) else 0}")
    return None


def refusals(cfg: Config, given: Collection[str] = (), has_run_dir: bool = True,
             applied: Collection[str] = ()) -> list[str]:
    """Every setting of ``cfg`` that a fit of a keras.Model would not apply, each as a message.

    ``given``: the keys the script set (:func:`given_keys`); without them, a key is refused only when its
    value differs from the default (a key set to its default cannot be told from one left out).
    ``applied``: the keys the caller applied before the fit (the config's model and data, built by
    :mod:`.config_fit`).
    """
    defaults = Config()
    found = []
    for key in all_keys():
        if key in HONOURED or key in applied or _derived(cfg, key, given):
            continue
        value, default = value_of(cfg, key), value_of(defaults, key)
        if not _applied(key, value, default, key in given):
            found.append(refusal(key, value, default))
    run_dir = None if has_run_dir else _run_dir_refusal(cfg, given)
    return found + ([run_dir] if run_dir else [])
