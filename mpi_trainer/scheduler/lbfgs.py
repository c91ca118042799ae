"""The scheduler rank under full-batch L-BFGS (``model.optimizer = "lbfgs"``).

Separation of concerns: SciPy's L-BFGS-B owns the search (directions, line
search, curvature history); :func:`~mpi_trainer.algorithms.lbfgs.minimize`
wraps it. This engine owns the parameter vector's round trips to the
workers, scores each accepted iterate and turns it into a row, which it hands
to the :class:`~mpi_trainer.scheduler.recorder.RoundRecorder` as the other engines
do; the recorder owns early stopping, checkpoints (``checkpoint.every`` and
``every_seconds``) and every file of the run directory: rounds.csv, summary.json,
TensorBoard, the timeline. Workers own their blocks and compute
loss and gradient sums there. One function evaluation is
one broadcast of ``[flag, params]`` (float64) and one sum-reduction of
``[loss_sum, samples, seconds per worker, gradient_sum]`` (float64): one MPI
round trip. It speaks only through its :class:`~mpi_trainer.comm.protocol.SchedulerLink`.

An *iteration* plays the part of a round: rounds.csv gets one row per
accepted L-BFGS iterate, with the function evaluations it took.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.early_stopping import EarlyStopping
from mpi_trainer.algorithms.lbfgs import Iterate, LbfgsResult, LbfgsSettings, WireLayout, minimize
from mpi_trainer.algorithms.outer_optimizer import OuterSettings
from mpi_trainer.algorithms.wait_bounds import WaitBounds
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.messages import JobPlan
from mpi_trainer.comm.protocol import SchedulerLink
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import WorkerFailure
from mpi_trainer.logs import get_logger
from mpi_trainer.models.gradients import TrainableVector
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_files import BUILT_IN_METRICS
from mpi_trainer.persistence.run_record import NO_CONTEXT, RunContext, RunState, StopReason
from mpi_trainer.scheduler.evaluation import Evaluator
from mpi_trainer.scheduler.recorder import RoundRecorder
from mpi_trainer.scheduler.round_row import EngineState

# rounds.csv: the rows every engine writes, then what only an L-BFGS iteration has
LBFGS_COLUMNS = ["function_evaluations", "gradient_norm"]


def settings_from(cfg: Config, iterations: int) -> LbfgsSettings:
    options = cfg.lbfgs
    return LbfgsSettings(iterations, options.history_size, options.gtol, options.ftol, options.max_evaluations)


@dataclass
class IterationClock:
    """Time, worker seconds and bytes spent since the previous iteration was recorded."""

    started: float
    worker_seconds: np.ndarray
    evaluate_seconds: float = 0.0
    bytes: int = 0

    @classmethod
    def start(cls, workers: int) -> IterationClock:
        return cls(time.perf_counter(), np.zeros(workers))

    def add(self, seconds: float, worker_seconds: np.ndarray, nbytes: int) -> None:
        self.evaluate_seconds += seconds
        self.worker_seconds += worker_seconds
        self.bytes += nbytes

    def columns(self, ended: float) -> dict[str, Any]:
        """Timing columns up to ``ended`` (before the test evaluation)."""
        slowest = float(self.worker_seconds.max())
        return {"train_seconds_max": slowest, "train_seconds_min": float(self.worker_seconds.min()),
                # what the round trips took beyond the slowest worker's computing
                "comm_seconds": max(0.0, self.evaluate_seconds - slowest),
                # the scheduler's own L-BFGS work between evaluations
                "aggregate_seconds": max(0.0, ended - self.started - self.evaluate_seconds),
                "bytes": self.bytes,
                # one value per worker, by rank, as the other engines write it
                "worker_train_seconds": ";".join(f"{seconds:.4g}" for seconds in self.worker_seconds)}


class LbfgsScheduler:
    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        self.link, self.cfg, self.dataset, self.model = link, cfg, dataset, model
        self.transport = transport = link.transport  # read only: byte and wait counters
        self.plan = plan
        self.log = get_logger()
        self.codec = WeightCodec.from_weights(model.get_weights())
        self.vector = TrainableVector(model)
        self.layout = WireLayout(self.vector.size, transport.workers)
        self.request = self.layout.request()
        self.message = ""  # SciPy's word on how it ended
        self.preempted = False  # a preemption signal came: checkpointed after an iterate, every rank exits 75
        self.clock = IterationClock.start(transport.workers)
        self.last_gradient: tuple[np.ndarray, np.ndarray] | None = None
        if resume is not None:  # before the recorder is built, so that it starts from the checkpoint's weights
            self.codec.load(model, resume.weights)
        self.evaluator = Evaluator(cfg, dataset, model, self.codec)
        hosts = hosts or [transport.host] * transport.size
        # every file of the run directory (rows, summary, checkpoints, TensorBoard, timeline) is the recorder's
        outer = OuterSettings.from_config(cfg, len(plan.block_bounds)).name  # none: L-BFGS takes no outer step
        self.recorder = RoundRecorder(cfg, dataset, model, self.codec, plan, run_dir, transport, hosts, resume,
                                      context, outer_optimizer=outer, extra_columns=LBFGS_COLUMNS)
        self.observers = self.recorder.observers
        self.start_iteration = self.recorder.start_round  # after a resume, the first iteration this run computes
        self.evaluations_before = self.recorder.state.steps  # function evaluations of the run before a resume
        # what summary.json holds only for L-BFGS: no learning rate, the function evaluations, SciPy's last
        # message and the float64 parameter vector's size
        self.recorder.note_summary(learning_rate=None, function_evaluations=self.evaluations,
                                   optimizer_message=self.message, parameter_bytes=self.vector.size * 8)
        if resume is not None:
            self.log.info("resuming L-BFGS after iteration %d (%d function evaluations so far) with an empty "
                          "curvature history", resume.next_round - 1, resume.steps)

    @property
    def workers(self) -> int:
        return self.transport.workers

    @property
    def state(self) -> RunState:
        return self.recorder.state

    @property
    def early(self) -> EarlyStopping:
        return self.recorder.early

    @property
    def run_dir(self) -> Path:
        return self.recorder.run_dir

    @property
    def worker_timeout(self) -> float:
        """``watchdog.worker_timeout``, else the set-up bound (iterations are not paced like rounds)."""
        return self.cfg.watchdog.worker_timeout or getattr(self.transport, "bound", None) or WaitBounds().setup

    # -- the run ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.log.info("full-batch L-BFGS: %d workers, model %s (%d trainable parameters), at most %d "
                      "iterations and %d function evaluations", self.workers, self.cfg.model.name,
                      self.vector.size, self.cfg.train.epochs, self.cfg.lbfgs.max_evaluations)
        try:
            self.collective(self.link.broadcast_weights, self.codec.flatten(self.model.get_weights()),
                            "take the initial weights")
            self.recorder.count_bytes(self.transport.take_bytes())  # set-up and the initial weights
            self.recorder.begin()
            outcome = self.optimize()
            self.release_workers()
            return self.finish(outcome)
        finally:
            self.recorder.close()

    def optimize(self) -> LbfgsResult | None:
        """L-BFGS for the iterations left; None when a resumed run has none left."""
        remaining = self.cfg.train.epochs - self.start_iteration
        if remaining <= 0:
            return None
        self.clock = IterationClock.start(self.workers)
        return minimize(self.evaluate, self.vector.read(), settings_from(self.cfg, remaining),
                        self.on_iteration, self.start_iteration)

    def collective(self, verb: Callable[..., None], buffer: np.ndarray, what: str) -> None:
        try:
            verb(buffer, timeout=self.worker_timeout)
        except TimeoutError:
            given = self.cfg.watchdog.worker_timeout
            bound = (f"watchdog.worker_timeout={given:g} s" if given else
                     f"{self.worker_timeout:g} s (the set-up bound; set watchdog.worker_timeout to change it)")
            raise WorkerFailure(f"watchdog: the workers did not {what} within {bound}; ending the job") from None

    def evaluate(self, params: np.ndarray) -> tuple[float, np.ndarray]:
        """One round trip: the mean loss and gradient over every block at ``params``."""
        started = time.perf_counter()
        self.layout.fill_request(self.request, params)
        self.collective(self.link.broadcast_weights, self.request, "take the parameters")
        contribution = self.layout.contribution()  # the scheduler adds zeros
        self.collective(self.link.reduce_sum, contribution, "complete the gradient reduction")
        sums = self.layout.unpack(contribution)
        if sums.samples != self.plan.num_train:
            raise RuntimeError(f"the workers summed over {sums.samples} samples; the blocks hold "
                               f"{self.plan.num_train}")
        # The broadcast is counted by the transport; each worker also sent one contribution.
        sent = self.transport.take_bytes() + contribution.nbytes * self.workers
        self.clock.add(time.perf_counter() - started, sums.seconds, sent)
        self.observers.span("wait", self.next_iteration, started)  # the timeline's name for a round trip
        loss, gradient = sums.mean()
        self.last_gradient = (params.copy(), gradient)
        return loss, gradient

    @property
    def next_iteration(self) -> int:
        """The iteration being computed (the one after the last recorded)."""
        rounds = self.state.rounds
        return int(rounds[-1]["round"]) + 1 if rounds else self.start_iteration

    def gradient_norm(self, params: np.ndarray) -> float:
        """The largest gradient component at ``params`` (what ``lbfgs.gtol`` bounds), if it was evaluated there."""
        if self.last_gradient is None or not np.array_equal(self.last_gradient[0], params):
            return math.nan
        return float(np.max(np.abs(self.last_gradient[1])))

    def on_iteration(self, iterate: Iterate) -> bool:
        """Record one accepted iterate, then early stopping, a checkpoint when one is due (``checkpoint.every``,
        ``every_seconds``, a preemption) and the callbacks; True ends the run."""
        ended = time.perf_counter()
        self.vector.assign(iterate.params)
        weights = self.codec.flatten(self.model.get_weights())
        evaluation, eval_seconds = self.score(weights, iterate.iteration)
        evaluations = self.evaluations_before + iterate.evaluations
        row: dict[str, Any] = {
            "round": iterate.iteration, **self.clock.columns(ended), "eval_seconds": eval_seconds,
            "wall_seconds": time.perf_counter() - self.clock.started, "max_staleness": 0,
            "train_loss": iterate.loss, "function_evaluations": evaluations,
            "gradient_norm": self.gradient_norm(iterate.params), "samples": self.plan.num_train,
            "workers": self.workers, **evaluation}
        self.state.steps = evaluations
        self.recorder.note_summary(function_evaluations=evaluations)
        self.record(row)
        stop = self.recorder.watch(iterate.iteration, row[self.early.monitor], weights)
        self.preempted = self.recorder.preempting() and iterate.iteration + 1 < self.cfg.train.epochs
        if self.recorder.checkpoint_due(iterate.iteration):  # no optimizer state: the curvature starts anew
            self.recorder.checkpoint(iterate.iteration, weights, EngineState())
        stop = self.recorder.run_callbacks(iterate.iteration, row, weights, model_holds=True) or stop
        self.clock = IterationClock.start(self.workers)
        return stop or self.preempted

    def score(self, weights: np.ndarray, iteration: int) -> tuple[dict[str, float], float]:
        """The test (and validation) metrics of ``weights``, every fixed column filled (NaN where unscored)."""
        started = time.perf_counter()
        names = dict.fromkeys([*BUILT_IN_METRICS, *self.plan.metric_names])  # the fixed columns always filled
        out = {f"{split}_{name}": math.nan for name in names for split in ("test", "val")}
        measured, seconds = self.evaluator.evaluate(weights, iteration)
        out.update({key: value for key, value in measured.items() if key in out})
        self.observers.span("evaluate", iteration, started)
        return out, seconds

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rows of rounds.csv so far (one per iteration)."""
        return self.state.rounds

    def record(self, row: dict[str, Any]) -> None:
        """rounds.csv, the progress line, TensorBoard and the timeline, and summary.json (at most once a second)."""
        self.recorder.write_row(row)
        self.log.debug("iteration %d: train loss %.6g, %d function evaluations", row["round"], row["train_loss"],
                       row["function_evaluations"])

    # -- the end -------------------------------------------------------------
    @property
    def evaluations(self) -> int:
        rounds = self.state.rounds
        return int(rounds[-1]["function_evaluations"]) if rounds else self.evaluations_before

    def release_workers(self) -> None:
        self.layout.fill_request(self.request, None, self.preempted)
        self.collective(self.link.broadcast_weights, self.request, "take the stop request")
        self.recorder.count_bytes(self.transport.take_bytes())

    def finish(self, outcome: LbfgsResult | None) -> dict[str, Any]:
        """The recorder's end of the run: the iterate kept (the best after an early or NaN stop), the final
        weights and checkpoint, summary.json and the table."""
        self.state.stop_reason = (StopReason.PREEMPTED if self.preempted else
                                  StopReason(outcome.reason) if outcome else StopReason.EPOCHS)
        self.message = outcome.message if outcome else "no iterations left"
        if self.state.stop_reason in (StopReason.NAN, StopReason.ABNORMAL):
            self.log.warning("L-BFGS stopped: %s", self.message)
        self.recorder.note_summary(optimizer_message=self.message)
        weights = self.codec.flatten(self.model.get_weights())
        self.recorder.final_checkpoint(weights, EngineState())  # no optimizer state: the curvature starts anew
        summary = self.recorder.finish(weights)
        self.log.info("L-BFGS: %d function evaluations in %d iterations (%s)", self.evaluations,
                      summary["rounds_completed"], self.message)
        return summary
