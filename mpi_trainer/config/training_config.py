"""The sections that say what is trained and how: ``model``, ``train``, ``aggregation``,
``early_stopping``, ``evaluation`` and ``lbfgs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from mpi_trainer.config.choices import (
    AGGREGATION_METHODS,
    DEFAULT_MONITOR,
    DEVICES,
    DIVERGENCE_POLICIES,
    EVALUATION_PLACES,
    EVERY_LOCAL_EPOCH,
    LBFGS,
    MONITOR_MODES,
    MONITOR_PATTERN,
    NAN_POLICIES,
    OPTIMIZER_STATES,
    OUTER_LEARNING_RATES,
    OUTER_OPTIMIZERS,
    OUTPUT_ACTIVATIONS,
    SCHEDULER_DEVICES,
    WIRE_DTYPES,
    AggregationMethod,
    Device,
    DivergencePolicy,
    EvaluationPlace,
    MonitorMode,
    NanPolicy,
    OptimizerState,
    OuterOptimizer,
    OutputActivation,
    SchedulerDevice,
    WireDtype,
)
from mpi_trainer.config.section import Section


@dataclass
class ModelConfig(Section):
    prefix: ClassVar[str] = "model"
    name: str = "mlp"
    optimizer: str = "adam"
    learning_rate: float = 1e-3
    activation: OutputActivation = "softmax"
    # "cross_entropy" / "squared_error" (chosen for the labels, see models.implied_loss) or any Keras loss
    # identifier; checked against Keras when the model is built, before training.
    loss: str = "cross_entropy"
    # Keras metric identifiers; empty = accuracy for class labels and cross-entropy, none for regression.
    metrics: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._positive("learning_rate")
        self._choice("activation", OUTPUT_ACTIVATIONS)
        self._require(bool(self.loss), "loss", "must name a loss: 'cross_entropy', 'squared_error' or a Keras loss")
        self._require(all(isinstance(m, str) and m for m in self.metrics), "metrics",
                      "must list Keras metric identifiers such as 'accuracy' or 'mae'")
        self._require(bool(self.name), "name", "must name a zoo model or `package.module:function`")
        self._require(bool(self.optimizer), "optimizer", "must name a Keras optimizer or 'lbfgs'")

    @property
    def sigmoid_output(self) -> bool:
        """``activation = "sigmoid"``: independent outputs (multi-label or binary), not a softmax."""
        return self.activation == "sigmoid"

    @property
    def cross_entropy(self) -> bool:
        """``loss = "cross_entropy"``: the cross-entropy that the output and the labels imply."""
        return self.loss == "cross_entropy"

    @property
    def squared_error(self) -> bool:
        """``loss = "squared_error"``: mean squared error, against the one-hot label for classes."""
        return self.loss == "squared_error"

    @property
    def uses_lbfgs(self) -> bool:
        """Full-batch L-BFGS (``optimizer = "lbfgs"``) instead of a Keras optimizer."""
        return self.optimizer == LBFGS



@dataclass
class TrainConfig(Section):
    prefix: ClassVar[str] = "train"
    epochs: int = 20
    batch_size: int = 32
    seed: int = 0
    # Each worker visits its block in a new random order every local epoch (false: in row order).
    shuffle: bool = True
    # Total optimizer steps (batches, summed over workers) after which the run stops; 0 = no limit.
    max_steps: int = 0
    # Local optimizer steps per round (0 = one local epoch per round). At k > 0 each worker walks
    # its block in a shuffled order that carries on from round to round. "auto": k chosen from the
    # first round's cost against a step's (docs/rounds.md); one epoch per round where the input or
    # another setting allows no rounds of steps.
    sync_every: int | Literal["auto"] = 0
    # Post-local SGD: for the first ``sync_warmup_epochs`` local epochs (0 = no warm-up) every round is
    # ``sync_warmup_every`` steps; ``sync_every`` applies after. Rounds stay synchronisations.
    sync_warmup_epochs: int = 0
    sync_warmup_every: int = 1
    nan_policy: NanPolicy = "stop"
    # A finite divergence (the loss above its first round's, or the accuracy fallen to chance, for
    # divergence_rounds scored rounds in a row): "warn" logs it and lists it in summary.json, "stop" also
    # ends the run as nan_policy = "stop" ends a non-finite one (the best weights kept), "off" does neither.
    divergence: DivergencePolicy = "warn"
    divergence_rounds: int = 3
    # Synchronous rounds: hand out epoch r+1's first round before epoch r is scored, so the workers
    # train while rank 0 scores and runs the callbacks. What a callback sets then takes effect a
    # round later; a round trained past the fit's stop (early stopping) is dropped.
    overlap_eval: bool = False
    # Each worker's backend threads; 0 = the node's cores divided by the workers on it.
    threads: int = 0
    # Where a node's CPU workers fill its cores, each keeps to its own (as many as its threads),
    # unless mpirun bound it already; false leaves every rank free to run on any core.
    bind_cores: bool = True
    # Workers: a GPU of their node when it has one (auto), or always the CPU, or a GPU or fail (gpu).
    device: Device = "auto"
    # The scheduler aggregates in NumPy and evaluates; it takes a GPU only when asked to.
    scheduler_device: SchedulerDevice = "cpu"

    def __post_init__(self) -> None:
        self._positive("epochs", "batch_size")
        self._non_negative("seed", "max_steps", "threads", "sync_warmup_epochs")
        if self.sync_every != "auto":
            self._non_negative("sync_every")
        self._positive("sync_warmup_every")
        self._choice("nan_policy", NAN_POLICIES)
        self._choice("divergence", DIVERGENCE_POLICIES)
        self._positive("divergence_rounds")
        self._choice("device", DEVICES)
        self._choice("scheduler_device", SCHEDULER_DEVICES)

    @property
    def sync_auto(self) -> bool:
        """``sync_every = "auto"``: the steps of a round are chosen from the job's first round."""
        return self.sync_every == "auto"

    @property
    def sync_steps(self) -> int:
        """The steps of a round as set (0: an epoch, and before ``"auto"`` has chosen)."""
        return 0 if self.sync_every == "auto" else int(self.sync_every)

    @property
    def rolls_back(self) -> bool:
        """``nan_policy = "rollback"``: a non-finite round is trained again from its starting weights."""
        return self.nan_policy == "rollback"

    @property
    def watches_divergence(self) -> bool:
        """``divergence`` is ``"warn"`` or ``"stop"``: a finite divergence is looked for."""
        return self.divergence != "off"

    @property
    def stops_on_divergence(self) -> bool:
        """``divergence = "stop"``: a confirmed divergence ends the run, keeping the best weights."""
        return self.divergence == "stop"


@dataclass
class AggregationConfig(Section):
    prefix: ClassVar[str] = "aggregation"
    method: AggregationMethod = "average"
    ssp: int = 0
    staleness_damping: bool = False
    # The dtype weights travel in; the global model and every sum stay float32.
    wire_dtype: WireDtype = "float32"
    # "local": each worker keeps its optimizers' moments (only the model's state travels); "combined": they
    # travel and are combined by meaning
    optimizer_state: OptimizerState = "combined"
    # The step from each round's aggregate to the next global model (docs/outer-optimizer.md);
    # outer_learning_rate = 0 takes the outer optimizer's own default (OUTER_LEARNING_RATES).
    outer_optimizer: OuterOptimizer = "auto"
    outer_learning_rate: float = 0.0
    outer_momentum: float = 0.5
    outer_beta_1: float = 0.9
    outer_beta_2: float = 0.999
    outer_epsilon: float = 1e-7

    def __post_init__(self) -> None:
        self._choice("method", AGGREGATION_METHODS)
        self._non_negative("ssp")
        self._choice("wire_dtype", WIRE_DTYPES)
        self._choice("optimizer_state", OPTIMIZER_STATES)
        self._choice("outer_optimizer", OUTER_OPTIMIZERS)
        self._require(self.outer_learning_rate >= 0, "outer_learning_rate",
                      "must be > 0, or 0 for the outer optimizer's default")
        self._non_negative("outer_epsilon")
        if self.outer_learning_rate == 0:
            self.outer_learning_rate = OUTER_LEARNING_RATES[self.outer_optimizer]
        self._require(0 <= self.outer_momentum < 1, "outer_momentum", "must lie in the interval [0, 1)")
        for name in ("outer_beta_1", "outer_beta_2"):
            self._fraction(name, low_open=False)

    @property
    def steps_outer(self) -> bool:
        """An outer optimizer was chosen by name (not ``"none"`` or ``"auto"``): it steps from each round's
        aggregate, and a run without round aggregates is refused."""
        return self.outer_optimizer not in ("none", "auto")

    @property
    def elects(self) -> bool:
        """Best-of: one worker's weights are elected (on the validation split) instead of averaged."""
        return self.method == "best"

    @property
    def local_optimizer_state(self) -> bool:
        """``optimizer_state = "local"``: each worker keeps its optimizers' moments; they never travel."""
        return self.optimizer_state == "local"

    @property
    def synchronous(self) -> bool:
        """Synchronous SGD: the workers' gradients are summed at every step and every worker applies the same
        update, as one process on the global batch; the epoch's state is one worker's (all hold the same)."""
        return self.method == "synchronous"

    @property
    def weighs_by_samples(self) -> bool:
        """``method = "weighted"``: each worker's weights count in the average by the samples it trained on."""
        return self.method == "weighted"

    @property
    def wire_dtype_auto(self) -> bool:
        """``wire_dtype = "auto"``: float16 or float32, chosen at the job's start by timing each link."""
        return self.wire_dtype == "auto"

    @property
    def outer_optimizer_auto(self) -> bool:
        """``outer_optimizer = "auto"``: Nesterov where rounds average two or more workers, else none."""
        return self.outer_optimizer == "auto"


@dataclass
class EarlyStoppingConfig(Section):
    prefix: ClassVar[str] = "early_stopping"
    patience: int = 0
    min_delta: float = 0.0
    monitor: str = DEFAULT_MONITOR
    # min: smaller is better; max: larger; auto: from the name (losses and errors min, scores max)
    mode: MonitorMode = "auto"

    def __post_init__(self) -> None:
        self._non_negative("patience", "min_delta")
        self._require(MONITOR_PATTERN.fullmatch(self.monitor) is not None, "monitor",
                      "must be test_<metric> or val_<metric>, e.g. 'test_accuracy', 'val_loss' or 'test_mae'")
        self._choice("mode", MONITOR_MODES)


@dataclass
class EvaluationConfig(Section):
    """How often the global model is scored on the test split, and by whom.

    ``every = 0`` (the default) scores once per local epoch, as Keras ``fit``
    does: every round when a round is a local epoch; at ``train.sync_every = k``,
    where a round is k steps and scoring every round would cost more than the
    training, the round that completes a local epoch of the largest block.
    ``every = n`` scores every n-th round. The last round is always scored.
    Rounds in between have empty test columns, and early stopping counts scored
    rounds only.
    """

    prefix: ClassVar[str] = "evaluation"
    every: int = EVERY_LOCAL_EPOCH
    # "workers": each worker scores its shard of the test (and validation) split and the metric
    # states are summed, so the scheduler does not score alone while the workers wait; "auto": the
    # workers where every one of them is on a GPU, else the scheduler (trainer.scoring_choice).
    where: EvaluationPlace = "auto"

    def __post_init__(self) -> None:
        self._non_negative("every")
        self._choice("where", EVALUATION_PLACES)

    @property
    def on_workers(self) -> bool:
        """``where = "workers"``: each worker scores its shard and the metric states are summed."""
        return self.where == "workers"


@dataclass
class LbfgsConfig(Section):
    """Full-batch L-BFGS (``model.optimizer = "lbfgs"``); ``train.epochs`` is the iteration limit.

    ``history_size`` is the number of correction pairs L-BFGS keeps (SciPy's
    ``maxcor``); ``gtol`` stops when the largest gradient component falls below
    it, ``ftol`` when the relative loss decrease does; ``max_evaluations``
    bounds the loss-and-gradient evaluations (each one MPI round trip).
    ``batch_size`` is how many rows a worker pushes through the model at once
    while it sums its block's gradient: it bounds memory, not the result.
    """

    prefix: ClassVar[str] = "lbfgs"
    history_size: int = 10
    gtol: float = 1e-5
    ftol: float = 2.220446049250313e-09
    max_evaluations: int = 15000
    batch_size: int = 4096

    def __post_init__(self) -> None:
        self._positive("history_size", "max_evaluations", "batch_size")
        self._non_negative("gtol", "ftol")
