"""Rules that span config sections (each section checks its own keys in :mod:`.schema`).

Each rule refuses a combination that would otherwise fail, or silently do
nothing, part-way through a run. The loader applies them once, then fills in
the values that depend on several sections (:func:`with_derived_values`).
"""

from __future__ import annotations

import dataclasses

from mpi_trainer.config.schema import DEFAULT_VALIDATION_SIZE, Config
from mpi_trainer.errors import ConfigError


def _ssp_rule(cfg: Config) -> None:
    """SSP (``aggregation.ssp > 0``): each worker's update merges as it arrives, on the worker's own clock;
    refuse what only synchronous rounds can do."""
    ssp, aggregation, train = cfg.aggregation.ssp, cfg.aggregation, cfg.train
    if not ssp:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "aggregation.method": (aggregation.elects, aggregation.method, "'average' or 'weighted'",
                               "an election needs every worker's state of one epoch at once"),
        "train.sync_every": (train.sync_steps > 0, train.sync_every, "0", "an SSP update is a worker's whole epoch"),
        "train.max_steps": (train.max_steps > 0, train.max_steps, "0",
                            "it splits the last synchronous round into step budgets"),
        "train.overlap_eval": (train.overlap_eval, train.overlap_eval, "false",
                               "it hands out a synchronous round before the last one is scored, and under SSP the "
                               "workers never wait for the scoring"),
        "train.nan_policy": (train.rolls_back, train.nan_policy, "'stop'", "a rollback re-runs a synchronous round"),
        "fault.survive": (cfg.fault.survive, cfg.fault.survive, "false",
                          "the synchronous epochs are what restart with the survivors"),
        "data.rebalance": (cfg.data.rebalance, cfg.data.rebalance, "false",
                           "the blocks are re-cut between synchronous epochs"),
        "evaluation.where": (cfg.evaluation.on_workers, cfg.evaluation.where, "'scheduler'",
                             "the workers are busy with their next epochs"),
        "aggregation.wire_dtype": (aggregation.wire_dtype in ("float16", "bfloat16"), aggregation.wire_dtype,
                                   "'float32' or 'auto'",
                                   "each worker's state travels to and from rank 0 on its own, in float32"),
    }
    _refuse_conflicts("aggregation.ssp", ssp, "aggregation.ssp = 0", conflicts)


def _damping_rule(cfg: Config) -> None:
    ssp, method = cfg.aggregation.ssp, cfg.aggregation.method
    if cfg.aggregation.staleness_damping and (ssp == 0 or cfg.aggregation.elects):
        raise ConfigError("`aggregation.staleness_damping` scales merged SSP updates, so it needs "
                          "aggregation.ssp > 0 and method 'average' or 'weighted'. Received: "
                          f"aggregation.staleness_damping=True with aggregation.ssp={ssp} and "
                          f"aggregation.method={method!r}")


def needs_validation(cfg: Config) -> bool:
    """Best-of election and a ``val_*`` monitor read the validation split; nothing else needs one."""
    return cfg.aggregation.elects or cfg.early_stopping.monitor.startswith("val_")


def _sync_every_rules(cfg: Config) -> None:
    """Rounds of k local steps: a worker's walk through its block spans rounds, and every worker
    runs the same k steps whatever its block size."""
    k = cfg.train.sync_steps
    if k == 0:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "data.increment.enabled": (cfg.data.increment.enabled, True, "false", "each round's random draw is made "
                                   "for one local epoch, while with k steps per round the walk through the block "
                                   "spans rounds"),
        "data.rebalance": (cfg.data.rebalance, True, "false", "every worker runs the same k steps per round "
                           "whatever its block size, so re-cut blocks would not even out the round times"),
    }
    _refuse_conflicts("train.sync_every", k, "train.sync_every = 0", conflicts)


def _warmup_conflicts(cfg: Config) -> dict[str, tuple[bool, object, str, str]]:
    """Key -> (set?, value, what is expected, why a synchronisation warm-up cannot honour it)."""
    data = cfg.data
    return {
        "aggregation.ssp": (cfg.aggregation.ssp > 0, cfg.aggregation.ssp, "0",
                            "the schedule counts synchronous rounds, while SSP updates run on each worker's clock"),
        "data.increment.enabled": (data.increment.enabled, data.increment.enabled, "false",
                                   "the warm-up walks each worker's fixed block across rounds"),
        "data.rebalance": (data.rebalance, data.rebalance, "false",
                           "every worker runs the same steps per warm-up round whatever its block size"),
    }


def _warmup_rules(cfg: Config) -> None:
    """Post-local SGD's warm-up (``train.sync_warmup_epochs``): refuse what it would break or ignore."""
    train = cfg.train
    if train.sync_warmup_epochs == 0:
        if train.sync_warmup_every != 1:
            raise ConfigError("`train.sync_warmup_every` sets the steps per round of a warm-up, and there is "
                              "none: set train.sync_warmup_epochs > 0 as well. Received: "
                              f"train.sync_warmup_every={train.sync_warmup_every} with train.sync_warmup_epochs=0")
        return
    _refuse_conflicts("train.sync_warmup_epochs", train.sync_warmup_epochs, "train.sync_warmup_epochs = 0",
                      _warmup_conflicts(cfg))


def _lbfgs_conflicts(cfg: Config) -> dict[str, tuple[bool, object, str]]:
    """Key -> (set?, value, why L-BFGS cannot honour it)."""
    data, train = cfg.data, cfg.train
    return {
        "aggregation.ssp": (cfg.aggregation.ssp > 0, cfg.aggregation.ssp,
                            "every evaluation needs the gradient of every block at the same point"),
        "aggregation.method": (cfg.aggregation.elects, cfg.aggregation.method,
                               "the gradient is the sum over all blocks, not one block's"),
        "data.increment.enabled": (data.increment.enabled, data.increment.enabled,
                                   "the objective must not change between evaluations"),
        "data.augmentation.enabled": (data.augmentation.enabled, data.augmentation.enabled,
                                      "the objective must not change between evaluations"),
        "data.rebalance": (data.rebalance, data.rebalance, "blocks are fixed for the whole run"),
        "train.max_steps": (train.max_steps > 0, train.max_steps, "use lbfgs.max_evaluations"),
        "train.sync_every": (train.sync_steps > 0, train.sync_every,
                             "every iteration takes the gradient of the whole data set, not local steps"),
        "train.sync_warmup_epochs": (train.sync_warmup_epochs > 0, train.sync_warmup_epochs,
                                     "every iteration takes the gradient of the whole data set, not local steps"),
        "evaluation.every": (cfg.evaluation.every > 1, cfg.evaluation.every,
                             "every iteration is evaluated (use train.epochs to bound them)"),
        "train.overlap_eval": (train.overlap_eval, train.overlap_eval, "iterations cannot overlap"),
        "train.nan_policy": (train.rolls_back, train.nan_policy,
                             "a non-finite loss stops the run with the best iterate"),
    }


def _lbfgs_rule(cfg: Config) -> None:
    """Full-batch L-BFGS minimises one fixed objective, synchronously; refuse what would change that."""
    if not cfg.model.uses_lbfgs:
        return
    for key, (conflicts, value, why) in _lbfgs_conflicts(cfg).items():
        if conflicts:
            raise ConfigError(f"`{key}` is not available with model.optimizer='lbfgs' (full-batch L-BFGS): "
                              f"{why}. Received: {key}={value!r} with model.optimizer='lbfgs'")


def _evaluation_rule(cfg: Config) -> None:
    """Workers score the global model between synchronous rounds, when they would otherwise wait."""
    if not cfg.evaluation.on_workers:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "aggregation.ssp": (cfg.aggregation.ssp > 0, cfg.aggregation.ssp, "0",
                            "under SSP the workers never wait for the scheduler, so it scores alone"),
        "train.overlap_eval": (cfg.train.overlap_eval, cfg.train.overlap_eval, "False",
                               "the workers are already training the next round while a round is scored"),
        "model.optimizer": (cfg.model.uses_lbfgs, cfg.model.optimizer, "anything but 'lbfgs'",
                            "L-BFGS scores its iterates on the scheduler"),
    }
    _refuse_conflicts("evaluation.where", "workers", "evaluation.where = 'scheduler'", conflicts)


def _outer_optimizer_rule(cfg: Config) -> None:
    """The outer step moves the global model once per synchronous round; refuse where there is none."""
    if not cfg.aggregation.steps_outer:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "aggregation.ssp": (cfg.aggregation.ssp > 0, cfg.aggregation.ssp, "0",
                            "SSP merges each update as it arrives, so there is no round aggregate to step from"),
        "model.optimizer": (cfg.model.uses_lbfgs, cfg.model.optimizer, "a Keras optimizer",
                            "L-BFGS sums gradients, it does not average trained weights"),
    }
    _refuse_conflicts("aggregation.outer_optimizer", cfg.aggregation.outer_optimizer,
                      "aggregation.outer_optimizer = 'none'", conflicts)


def _fault_rule(cfg: Config) -> None:
    """``fault.survive`` shrinks the job and re-plans the blocks; refuse what cannot carry on that way."""
    if not cfg.fault.survive:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "model.optimizer": (cfg.model.uses_lbfgs, cfg.model.optimizer, "a Keras optimizer",
                            "full-batch L-BFGS needs the gradient of every block at each iteration"),
    }
    _refuse_conflicts("fault.survive", True, "fault.survive = false", conflicts)


def _synchronous_conflicts(cfg: Config) -> dict[str, tuple[bool, object, str, str]]:
    """Key -> (set?, value, expected, why synchronous SGD cannot honour it)."""
    aggregation, data, train = cfg.aggregation, cfg.data, cfg.train
    return {
        "aggregation.ssp": (aggregation.ssp > 0, aggregation.ssp, "0",
                            "every step waits for every worker's gradients"),
        "aggregation.outer_optimizer": (aggregation.steps_outer, aggregation.outer_optimizer, "'none' or 'auto'",
                                        "every worker applies the same update at every step: there is no "
                                        "averaged round to step from"),
        "train.sync_every": (train.sync_steps > 0, train.sync_every, "0",
                             "the workers are combined at every step already"),
        "train.sync_warmup_epochs": (train.sync_warmup_epochs > 0, train.sync_warmup_epochs, "0",
                                     "the workers are combined at every step already"),
        "train.overlap_eval": (train.overlap_eval, train.overlap_eval, "false",
                               "an epoch's steps cannot start before the last epoch's state is settled"),
        "data.increment.enabled": (data.increment.enabled, data.increment.enabled, "false",
                                   "each worker's steps must meet the others' at every step"),
        "data.rebalance": (data.rebalance, data.rebalance, "false",
                           "the workers wait for each other at every step, so no worker's share lags"),
        "fault.survive": (cfg.fault.survive, cfg.fault.survive, "false",
                          "a worker lost inside an epoch leaves the others inside a step's sum"),
        "model.optimizer": (cfg.model.uses_lbfgs, cfg.model.optimizer, "a Keras optimizer",
                            "L-BFGS sums full-batch gradients of its own"),
    }


def _refuse_conflicts(setting: str, value: object, otherwise: str,
                      conflicts: dict[str, tuple[bool, object, str, str]]) -> None:
    """The first of ``conflicts`` (key -> (set?, its value, what is expected, why)) that is set, refused with the
    setting ``setting`` = ``value`` it conflicts with, and ``otherwise``: the way out by that setting."""
    for key, (conflicts_with, received, expected, why) in conflicts.items():
        if conflicts_with:
            raise ConfigError(f"`{setting}` = {value!r} cannot be combined with {key}={received!r}: {why}. "
                              f"Received: {setting}={value!r}, {key}={received!r}; expected {key} = {expected}, "
                              f"or {otherwise}")


def _synchronous_rule(cfg: Config) -> None:
    """Synchronous SGD (``aggregation.method = "synchronous"``): refuse what needs rounds of local steps."""
    if cfg.aggregation.synchronous:
        _refuse_conflicts("aggregation.method", "synchronous", "another aggregation.method",
                          _synchronous_conflicts(cfg))


def _optimizer_state_rule(cfg: Config) -> None:
    """``aggregation.optimizer_state = "local"``: each worker's moments follow its own states, which rounds
    average; refuse where a worker's state is not averaged each round."""
    if not cfg.aggregation.local_optimizer_state:
        return
    aggregation = cfg.aggregation
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "aggregation.method": (aggregation.elects or aggregation.synchronous, aggregation.method,
                               "'average' or 'weighted'", "best-of keeps one worker's whole state, and synchronous "
                               "SGD holds one state on every worker"),
        "aggregation.ssp": (aggregation.ssp > 0, aggregation.ssp, "0",
                            "SSP merges each worker's update into the global state as it arrives"),
        "model.optimizer": (cfg.model.uses_lbfgs, cfg.model.optimizer, "a Keras optimizer",
                            "L-BFGS keeps its own history on rank 0"),
    }
    _refuse_conflicts("aggregation.optimizer_state", "local", "aggregation.optimizer_state = 'combined'", conflicts)


def _rebalance_rule(cfg: Config) -> None:
    """``data.rebalance`` re-cuts the blocks between whole epochs, by each worker's rows a second."""
    if not cfg.data.rebalance:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "data.increment.enabled": (cfg.data.increment.enabled, cfg.data.increment.enabled, "false",
                                   "each epoch's draw adds rows the blocks do not hold"),
        "train.max_steps": (cfg.train.max_steps > 0, cfg.train.max_steps, "0",
                            "the last steps are dealt out from the batches of blocks fixed for the fit"),
    }
    _refuse_conflicts("data.rebalance", True, "data.rebalance = false", conflicts)


def _max_steps_rule(cfg: Config) -> None:
    """``train.max_steps`` deals the steps left to the workers from the batches each trains in a whole epoch."""
    train = cfg.train
    if not train.max_steps:
        return
    conflicts: dict[str, tuple[bool, object, str, str]] = {
        "train.sync_every": (train.sync_steps > 0, train.sync_every, "0", "a round is then not a whole epoch"),
        "train.sync_warmup_epochs": (train.sync_warmup_epochs > 0, train.sync_warmup_epochs, "0",
                                     "a warm-up round is not a whole epoch"),
        "data.increment.enabled": (cfg.data.increment.enabled, cfg.data.increment.enabled, "false",
                                   "each epoch's draw changes the batches a worker has"),
    }
    _refuse_conflicts("train.max_steps", train.max_steps, "train.max_steps = 0", conflicts)


RULES = (_optimizer_state_rule, _synchronous_rule, _damping_rule, _ssp_rule, _sync_every_rules, _warmup_rules,
         _rebalance_rule, _max_steps_rule, _lbfgs_rule, _evaluation_rule, _outer_optimizer_rule, _fault_rule)


def check_config(cfg: Config) -> None:
    for rule in RULES:
        rule(cfg)


def with_derived_values(cfg: Config) -> Config:
    """A new config with the values that depend on other sections filled in (``cfg`` is left as it is):
    a validation split of ``DEFAULT_VALIDATION_SIZE`` when something reads one and none was asked for."""
    if cfg.data.validation_size == 0 and needs_validation(cfg):
        data = dataclasses.replace(cfg.data, validation_size=DEFAULT_VALIDATION_SIZE)
        return dataclasses.replace(cfg, data=data)
    return cfg
