"""The scheduler rank under full-batch L-BFGS (``model.optimizer = "lbfgs"``).

Separation of concerns: SciPy's L-BFGS-B owns the search (directions, line
search, curvature history); :func:`~mpi_trainer.algorithms.lbfgs.minimize`
wraps it. This engine owns the parameter vector's round trips to the
workers, evaluation on the test split after every iteration, early
stopping, checkpoints and every file of the run directory. Workers own their
blocks and compute loss and gradient sums there. One function evaluation is
one broadcast of ``[flag, params]`` (float64) and one sum-reduction of
``[loss_sum, samples, seconds per worker, gradient_sum]`` (float64): one MPI
round trip. It speaks only through its :class:`~mpi_trainer.comm.protocol.SchedulerLink`.

An *iteration* plays the part of a round: rounds.csv gets one row per
accepted L-BFGS iterate, with the function evaluations it took.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.early_stopping import EarlyStopping
from mpi_trainer.algorithms.lbfgs import Iterate, LbfgsResult, LbfgsSettings, WireLayout, minimize
from mpi_trainer.algorithms.wait_bounds import WaitBounds
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import JobPlan, SchedulerLink
from mpi_trainer.config import Config
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import EXIT_PREEMPTED, WorkerFailure
from mpi_trainer.logs import get_logger
from mpi_trainer.models import evaluate_model
from mpi_trainer.models.gradients import TrainableVector
from mpi_trainer.persistence.checkpoint import save_checkpoint
from mpi_trainer.persistence.preemption import preemption
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_files import (
    BUILT_IN_METRICS,
    CHECKPOINT_NAME,
    FINAL_WEIGHTS_NAME,
    ROUNDS_NAME,
    SUMMARY_NAME,
    RoundLog,
    round_fields,
    save_weights_atomic,
    write_json_atomic,
)
from mpi_trainer.persistence.run_record import (
    KEEPS_BEST,
    NO_CONTEXT,
    RunContext,
    RunState,
    RunSummary,
    StopReason,
    best_test_accuracy,
    final_columns,
)
from mpi_trainer.reporting.table import format_round_line, format_table

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
                "bytes": self.bytes}


class LbfgsScheduler:
    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        self.link, self.cfg, self.dataset, self.model = link, cfg, dataset, model
        self.transport = transport = link.transport  # read only: byte and wait counters
        self.plan, self.run_dir = plan, run_dir
        self.fingerprint = dict(context.fingerprint)  # the model's and data's, kept in checkpoints
        self.log = get_logger()
        self.codec = WeightCodec.from_weights(model.get_weights())
        self.vector = TrainableVector(model)
        self.layout = WireLayout(self.vector.size, transport.workers)
        self.request = self.layout.request()
        self.early = EarlyStopping.from_config(cfg.early_stopping, plan.metric_names, len(dataset.y_test) > 0)
        self.state = RunState()
        self.start_iteration = 0  # after a resume, the first iteration this run computes
        self.evaluations_before = 0  # function evaluations of the run before a resume
        self.message = ""  # SciPy's word on how it ended
        self.preempted = False  # a preemption signal came: checkpointed after an iterate, every rank exits 75
        self.started = time.perf_counter()
        self.clock = IterationClock.start(transport.workers)
        self.last_gradient: tuple[np.ndarray, np.ndarray] | None = None
        self.placement = [dict(rank) for rank in context.placement]  # host, backend and device of every rank
        if resume is not None:
            self.restore(resume)
        self.round_log = RoundLog(run_dir / ROUNDS_NAME, round_fields(plan.metric_names) + LBFGS_COLUMNS)

    def restore(self, resume: ResumeState) -> None:
        """Continue from a checkpoint's weights; SciPy's curvature history is not kept, so it starts afresh."""
        self.model.set_weights(self.codec.unflatten(resume.weights))
        self.early.best_value, self.early.best_round = resume.best_value, resume.best_round
        self.early.wait, self.early.best_weights = resume.wait, resume.best_weights
        self.state = RunState(resume.rounds, resume.traffic_bytes, steps=resume.steps, wall_offset=resume.wall_seconds)
        self.start_iteration, self.evaluations_before = resume.next_round, resume.steps
        self.log.info("resuming L-BFGS after iteration %d (%d function evaluations so far) with an empty "
                      "curvature history", resume.next_round - 1, resume.steps)

    @property
    def workers(self) -> int:
        return self.transport.workers

    @property
    def worker_timeout(self) -> float:
        """``watchdog.worker_timeout``, else the set-up bound (iterations are not paced like rounds)."""
        return self.cfg.watchdog.worker_timeout or getattr(self.transport, "bound", None) or WaitBounds().setup

    def elapsed(self) -> float:
        return self.state.wall_offset + time.perf_counter() - self.started

    # -- the run ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.log.info("full-batch L-BFGS: %d workers, model %s (%d trainable parameters), at most %d "
                      "iterations and %d function evaluations", self.workers, self.cfg.model.name,
                      self.vector.size, self.cfg.train.epochs, self.cfg.lbfgs.max_evaluations)
        try:
            self.collective(self.link.broadcast_weights, self.codec.flatten(self.model.get_weights()),
                            "take the initial weights")
            self.state.traffic_bytes += self.transport.take_bytes()  # set-up and the initial weights
            outcome = self.optimize()
            self.release_workers()
            return self.finish(outcome)
        finally:
            self.round_log.close()

    def optimize(self) -> LbfgsResult | None:
        """L-BFGS for the iterations left; None when a resumed run has none left."""
        remaining = self.cfg.train.epochs - self.start_iteration
        if remaining <= 0:
            return None
        self.clock = IterationClock.start(self.workers)
        return minimize(self.evaluate, self.vector.read(), settings_from(self.cfg, remaining),
                        self.on_iteration, self.start_iteration)

    def collective(self, verb: Any, buffer: np.ndarray, what: str) -> None:
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
        loss, gradient = sums.mean()
        self.last_gradient = (params.copy(), gradient)
        return loss, gradient

    def gradient_norm(self, params: np.ndarray) -> float:
        """The largest gradient component at ``params`` (what ``lbfgs.gtol`` bounds), if it was evaluated there."""
        if self.last_gradient is None or not np.array_equal(self.last_gradient[0], params):
            return math.nan
        return float(np.max(np.abs(self.last_gradient[1])))

    def on_iteration(self, iterate: Iterate) -> bool:
        """Record one accepted iterate; True ends the run (early stopping)."""
        ended = time.perf_counter()
        self.vector.assign(iterate.params)
        evaluation, eval_seconds = self.evaluate_splits()
        row = {"round": iterate.iteration, **self.clock.columns(ended), "eval_seconds": eval_seconds,
               "wall_seconds": time.perf_counter() - self.clock.started, "max_staleness": 0,
               "train_loss": iterate.loss,
               "function_evaluations": self.evaluations_before + iterate.evaluations,
               "gradient_norm": self.gradient_norm(iterate.params), "samples": self.plan.num_train,
               **evaluation}
        self.record(row)
        weights = self.codec.flatten(self.model.get_weights())
        stop = self.early.update(iterate.iteration, row[self.early.monitor], weights)
        every = self.cfg.checkpoint.every
        self.preempted = preemption().requested and iterate.iteration + 1 < self.cfg.train.epochs
        if self.preempted or (every > 0 and (iterate.iteration + 1) % every == 0):
            self.checkpoint(iterate.iteration, weights)
        self.clock = IterationClock.start(self.workers)
        return stop or self.preempted

    def evaluate_splits(self) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        batch = max(256, self.cfg.train.batch_size)
        names = dict.fromkeys([*BUILT_IN_METRICS, *self.plan.metric_names])  # the fixed columns always filled
        out = {f"{split}_{name}": math.nan for name in names for split in ("test", "val")}
        if len(self.dataset.y_test):  # data.test_size = 0 holds no test split out
            result = evaluate_model(self.model, self.dataset.x_test, self.dataset.y_test, batch)
            out.update({f"test_{name}": value for name, value in result.items() if name in names})
        if len(self.dataset.x_val):
            result = evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val, batch)
            out.update({f"val_{name}": value for name, value in result.items() if name in names})
        return out, time.perf_counter() - started

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rows of rounds.csv so far (one per iteration)."""
        return self.state.rounds

    def record(self, row: dict[str, Any]) -> None:
        self.state.traffic_bytes += row["bytes"]
        row["elapsed_seconds"] = self.elapsed()
        self.state.rounds.append(row)
        self.round_log.write(row)
        self.log.info("%s  train loss %.6g  %d evaluations", format_round_line(row, self.cfg.train.epochs),
                      row["train_loss"], row["function_evaluations"])
        write_json_atomic(self.run_dir / SUMMARY_NAME, self.summary())

    # -- checkpoints and the end -------------------------------------------
    @property
    def evaluations(self) -> int:
        rounds = self.state.rounds
        return int(rounds[-1]["function_evaluations"]) if rounds else self.evaluations_before

    def checkpoint(self, iteration: int, weights: np.ndarray) -> None:
        """The same file as other runs, so ``train --resume`` continues from it (with a fresh history)."""
        arrays = {"weights": weights}
        if self.early.best_weights is not None:
            arrays["best_weights"] = self.early.best_weights
        meta = {"round": iteration, "rounds_completed": iteration + 1, "best_value": self.early.best_value,
                "best_round": self.early.best_round, "wait": self.early.wait, "monitor": self.early.monitor,
                "block_bounds": self.plan.block_bounds, "shuffle_seed": self.plan.shuffle_seed,
                "traffic_bytes": self.state.traffic_bytes, "config": self.cfg.to_dict(),
                "steps": self.evaluations, "lr_scale": 1.0, "wall_seconds": self.elapsed(), "rollbacks": [],
                "workers": self.workers, "optimizer": "lbfgs", "fingerprint": self.fingerprint}
        save_checkpoint(self.run_dir / CHECKPOINT_NAME, arrays, meta)
        self.log.debug("checkpoint written after iteration %d", iteration)

    def release_workers(self) -> None:
        self.layout.fill_request(self.request, None, self.preempted)
        self.collective(self.link.broadcast_weights, self.request, "take the stop request")
        self.state.traffic_bytes += self.transport.take_bytes()

    def final_round(self) -> dict[str, Any] | None:
        """The iterate kept: the best one after an early or NaN stop, else the last."""
        rounds = self.state.rounds
        if self.state.stop_reason in KEEPS_BEST and self.early.best_weights is not None:
            self.model.set_weights(self.codec.unflatten(self.early.best_weights))
            return next(r for r in rounds if int(r["round"]) == self.early.best_round)
        return rounds[-1] if rounds else None

    def finish(self, outcome: LbfgsResult | None) -> dict[str, Any]:
        self.state.stop_reason = (StopReason.PREEMPTED if self.preempted else
                                  StopReason(outcome.reason) if outcome else StopReason.EPOCHS)
        self.message = outcome.message if outcome else "no iterations left"
        if self.state.stop_reason in (StopReason.NAN, StopReason.ABNORMAL):
            self.log.warning("L-BFGS stopped: %s", self.message)
        if self.preempted:  # no final weights yet: the checkpoint written after the iterate carries the run on
            self.log.warning("preempted (%s): checkpoint written after iteration %s; exiting with status %d. "
                             "Run the same command again to resume", preemption().signal_name,
                             self.state.rounds[-1]["round"], EXIT_PREEMPTED)
            return self.write_summary(self.state.rounds[-1])
        final = self.final_round()
        save_weights_atomic(self.model, self.run_dir / FINAL_WEIGHTS_NAME)
        if self.state.rounds:
            self.checkpoint(int(self.state.rounds[-1]["round"]), self.codec.flatten(self.model.get_weights()))
            self.log.info("per-iteration results:\n%s", format_table(self.state.rounds))
        summary = self.write_summary(final)
        accuracy = summary["final_test_accuracy"]
        self.log.info("done: %s after %d iterations (%d function evaluations), final test accuracy %s, "
                      "%.1f s, %.2f MB sent; run directory %s", summary["stop_reason"],
                      summary["rounds_completed"], self.evaluations,
                      "n/a" if accuracy is None else f"{accuracy:.4f}", summary["wall_seconds"],
                      summary["traffic_bytes"] / 1e6, self.run_dir)
        return summary

    def write_summary(self, final: dict[str, Any] | None) -> dict[str, Any]:
        summary = self.summary(final)
        write_json_atomic(self.run_dir / SUMMARY_NAME, summary)
        return summary

    def summary(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
        """summary.json: the same record as the other engines', with L-BFGS's own keys filled in."""
        rounds = self.state.rounds
        final = final or (rounds[-1] if rounds else {})
        return RunSummary(
            rounds_completed=len(rounds), **final_columns(final, self.plan.metric_names),
            best_test_accuracy=best_test_accuracy(rounds), metrics=self.plan.metric_names,
            monitor=self.early.monitor, best_value=self.early.best_value, best_round=self.early.best_round,
            wall_seconds=self.elapsed(), steps=self.evaluations, learning_rate=None, rollbacks=[],
            resumed_after_round=self.start_iteration - 1 if self.start_iteration else None,
            traffic_bytes=self.state.traffic_bytes, checkpoint_bytes=0, model_bytes=self.codec.nbytes,
            stop_reason=self.state.stop_reason, workers=self.workers, optimizer=self.cfg.model.optimizer,
            aggregation=self.cfg.aggregation.method, outer_optimizer=self.cfg.outer_optimizer_for(self.workers),
            ssp=self.cfg.aggregation.ssp, scheduler_wait_seconds=self.transport.wait_wall_seconds,
            scheduler_wait_cpu_seconds=self.transport.wait_cpu_seconds, dataset=self.dataset.describe(),
            placement=self.placement, function_evaluations=self.evaluations, optimizer_message=self.message,
            parameter_bytes=self.vector.size * 8,
        ).as_dict()
