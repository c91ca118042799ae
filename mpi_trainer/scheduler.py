"""The scheduler rank (rank 0).

Separation of concerns: the scheduler owns the global weights, the block plan,
the round clock, aggregation, evaluation on the test split, early stopping,
checkpoints and every file of the run directory; it is the only rank that
writes. Workers own local training. The algorithm pieces (aggregation rules,
early stopping, partitioning) are pure functions and classes in their own
modules; this class only sequences them and accounts for time and bytes.
It makes no MPI calls of its own: it speaks through
:class:`~mpi_trainer.comm.Transport`, whose waits sleep instead of spinning, so
the node's cores stay with the workers while they train.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer import aggregation, nan_guard
from mpi_trainer.checkpoint import load_checkpoint, save_checkpoint
from mpi_trainer.comm import TAG_ORDER, TAG_READY, TAG_REPORT, TAG_STATE, Transport
from mpi_trainer.config import Config
from mpi_trainer.data.increment import log_data_shares
from mpi_trainer.data.placement import ScatterLedger, send_moved_rows
from mpi_trainer.data.sources import Dataset
from mpi_trainer.early_stopping import EarlyStopping
from mpi_trainer.errors import WorkerFailure
from mpi_trainer.logs import RoundLog, get_logger, write_json_atomic
from mpi_trainer.messages import ROUND, SEND_OPTIMIZER, SEND_WEIGHTS, STOP, JobPlan, Order, Report
from mpi_trainer.models import evaluate_model
from mpi_trainer.optimizer_state import ARRAY_PREFIX, assign_states
from mpi_trainer.rebalance import Rebalancer
from mpi_trainer.report import format_round_line, format_table
from mpi_trainer.resume import CHECKPOINT_NAME, ResumeState, worker_seed
from mpi_trainer.ssp import idle_fraction
from mpi_trainer.stop_at_step import step_budgets, steps_per_round
from mpi_trainer.weights import WeightCodec

ROUND_FIELDS = [
    "round", "wall_seconds", "train_seconds_max", "train_seconds_min", "comm_seconds",
    "aggregate_seconds", "eval_seconds", "bytes", "test_loss", "test_accuracy", "max_staleness",
    "train_loss", "train_accuracy", "val_loss", "val_accuracy", "samples", "winner", "elapsed_seconds",
    "idle_fraction", "block_sizes", "steps",
]
RETRY = "retry"  # run_round outcome: the round is run again after a NaN rollback


@dataclass
class RunState:
    """What the scheduler knows about the run so far."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    traffic_bytes: int = 0
    stop_reason: str = "running"
    steps: int = 0
    lr_scale: float = 1.0
    wall_offset: float = 0.0
    consecutive_rollbacks: int = 0
    checkpoint_bytes: int = 0
    rollbacks: list[dict[str, Any]] = field(default_factory=list)


class Scheduler:
    def __init__(self, transport: Transport, cfg: Config, dataset: Dataset, model: Any,
                 plan: JobPlan, run_dir: Path, hosts: list[str] | None = None,
                 resume: ResumeState | None = None) -> None:
        self.transport = transport
        self.cfg = cfg
        self.dataset = dataset
        self.model = model
        self.plan = plan
        self.run_dir = run_dir
        self.log = get_logger()
        self.codec = WeightCodec.from_weights(model.get_weights())
        self.global_weights = self.codec.flatten(model.get_weights())
        self.early = EarlyStopping(cfg.early_stopping.monitor, cfg.early_stopping.patience,
                                   cfg.early_stopping.min_delta)
        self.state = RunState()
        self.started = time.perf_counter()
        self.hosts = hosts or [transport.host] * transport.size
        self.initial_weights = self.global_weights.copy()
        self.start_round = 0
        self.order_detail: dict[str, Any] = {}
        self.discarded_bytes = 0
        self.pending_states: dict[int, np.ndarray] = {}
        self.next_started: float | None = None  # set while the next round runs ahead (overlap_eval)
        if resume is not None:
            self.restore(resume)
        self.round_log = RoundLog(run_dir / "rounds.csv", ROUND_FIELDS)
        self.rebalancer = (Rebalancer(plan.block_bounds, cfg.data.rebalance_smoothing)
                           if cfg.data.rebalance else None)
        # Under scatter a re-cut moves rows: the ledger knows who holds what, ``moved`` what goes next.
        self.ledger = (ScatterLedger(cfg, plan, self.workers)
                       if cfg.data.rebalance and cfg.data.placement == "scatter" else None)
        self.moved: dict[int, np.ndarray] = {}

    def restore(self, resume: ResumeState) -> None:
        """Carry on from a checkpoint: weights, counters, and the time and bytes spent so far."""
        self.global_weights = resume.weights
        self.early.best_value, self.early.best_round = resume.best_value, resume.best_round
        self.early.wait, self.early.best_weights = resume.wait, resume.best_weights
        self.state = RunState(rounds=resume.rounds, traffic_bytes=resume.traffic_bytes, steps=resume.steps,
                              lr_scale=resume.lr_scale, wall_offset=resume.wall_seconds,
                              rollbacks=resume.rollbacks)
        self.start_round = resume.next_round
        self.pending_states = assign_states(resume.optimizer_states, self.workers)
        if resume.lr_scale != 1.0:
            self.order_detail["learning_rate"] = self.learning_rate
        self.log.info("resuming after round %d (%d steps so far); %d workers now, %d before%s",
                      resume.next_round - 1, resume.steps, len(self.workers), resume.previous_workers,
                      "" if resume.previous_workers == len(self.workers) else ": blocks re-planned")

    @property
    def learning_rate(self) -> float:
        return self.cfg.model.learning_rate * self.state.lr_scale

    def elapsed(self) -> float:
        """Wall seconds of the whole run, including the attempts before a resume."""
        return self.state.wall_offset + time.perf_counter() - self.started

    @property
    def workers(self) -> list[int]:
        return list(range(1, self.transport.size))

    # -- the run ----------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self.state.traffic_bytes += self.transport.take_bytes()  # set-up broadcast
        self.log.info("%d workers, %s aggregation, model %s (%d parameters, %.2f MiB per copy)",
                      len(self.workers), self.cfg.aggregation.method, self.cfg.model.name,
                      self.codec.size, self.codec.nbytes / 2**20)
        try:
            self.state.stop_reason = self.run_rounds()
            states = self.gather_optimizer_states() if self.needs_final_checkpoint() else {}
            self.release_workers()
            return self.finish(states)
        finally:
            self.round_log.close()

    def run_rounds(self) -> str:
        """Rounds from the start (or resume) point until one says stop; returns the stop reason."""
        round_index = self.start_round
        while round_index < self.cfg.train.epochs:
            if self.steps_exhausted():
                return "max_steps"
            outcome = self.run_round(round_index)
            if outcome == RETRY:
                continue
            round_index += 1
            if outcome:
                return outcome
        return "epochs"

    def steps_exhausted(self) -> bool:
        return 0 < self.cfg.train.max_steps <= self.state.steps

    def round_orders(self, round_index: int) -> dict[int, Order]:
        """Each worker's order, with a step budget when train.max_steps ends the run mid-round."""
        full = {worker: steps_per_round(end - start, self.cfg.train.batch_size)
                for worker, (start, end) in zip(self.workers, self.plan.block_bounds)}
        budgets = None
        if self.cfg.train.max_steps:
            budgets = step_budgets(self.cfg.train.max_steps - self.state.steps, full)
        orders = {}
        for worker in self.workers:
            detail = {**self.order_detail, **self.block_detail(worker)}
            if budgets is not None:
                detail["max_steps"] = budgets[worker]
            if worker in self.pending_states:
                detail["optimizer_state"] = True
            orders[worker] = Order(ROUND, round_index, detail)
        self.order_detail = {}
        return orders

    def dispatch(self, round_index: int) -> float:
        """Start a round on every worker (orders, "ready", weights); returns when it started."""
        started = time.perf_counter()
        for worker, order in self.round_orders(round_index).items():
            self.transport.send_object(order, worker, TAG_ORDER)
            if self.moved:
                self.send_moved(worker, round_index)
        self.moved = {}
        for worker, vector in self.pending_states.items():
            self.transport.send_object(vector, worker, TAG_STATE)
        self.pending_states = {}
        self.await_ready(started, round_index)
        self.broadcast_weights(round_index)
        return started

    def collect(self, started: float, round_index: int) -> tuple[list[Report], int, int]:
        if self.cfg.aggregation.method == "best":
            return self.collect_best(started, round_index)
        return self.collect_reduced(started, round_index)

    def overlaps(self, round_index: int) -> bool:
        """Whether the next round starts before this one is evaluated (train.overlap_eval).

        Not before a checkpoint: gathering the workers' optimizer state needs them idle.
        """
        every = self.cfg.checkpoint.every
        checkpoint_due = every > 0 and (round_index + 1) % every == 0
        return (self.cfg.train.overlap_eval and round_index + 1 < self.cfg.train.epochs
                and not checkpoint_due and not self.steps_exhausted())

    def run_round(self, round_index: int) -> str | None:
        """One synchronous round; returns a stop reason, RETRY after a NaN rollback, or None."""
        started = self.next_started if self.next_started is not None else self.dispatch(round_index)
        self.next_started = None
        before = self.global_weights
        reports, received, winner = self.collect(started, round_index)
        collected = time.perf_counter()
        outcomes = [nan_guard.WorkerOutcome(r.rank, r.train_loss, r.weights_finite) for r in reports]
        cause = nan_guard.non_finite_cause(outcomes, self.global_weights)
        if cause:
            self.discarded_bytes += received  # still traffic: counted with the next recorded round
            return self.on_non_finite(round_index, cause, before)
        self.state.consecutive_rollbacks = 0
        self.state.steps += sum(r.steps for r in reports)
        log_data_shares(self.log, self.cfg.data.increment, round_index, reports, self.plan.num_train)
        sent = self.transport.take_bytes() + received  # this round's bytes, before the next one starts
        self.rebalance(round_index, reports)
        if self.overlaps(round_index):
            # The workers train the next round while this one is evaluated and recorded.
            self.next_started = self.dispatch(round_index + 1)
        evaluation, eval_seconds = self.evaluate()
        row = self.round_row(round_index, reports, sent, winner, evaluation)
        ended = self.next_started if self.next_started is not None else time.perf_counter()
        wall = ended - started
        row.update(wall_seconds=wall, eval_seconds=eval_seconds,
                   comm_seconds=max(0.0, collected - started - row["train_seconds_max"]
                                    - row["aggregate_seconds"]),
                   idle_fraction=idle_fraction(wall, {r.rank: r.train_seconds for r in reports}),
                   block_sizes=";".join(str(r.samples) for r in reports))
        self.record(row)
        stop = self.early.update(round_index, row[self.cfg.early_stopping.monitor], self.global_weights)
        self.maybe_checkpoint(round_index)
        if stop:
            self.drain_next(round_index + 1)
            return "early_stopping"
        return "max_steps" if self.steps_exhausted() else None

    def drain_next(self, round_index: int) -> None:
        """Early stop with the next round already running: take its results in and discard them."""
        if self.next_started is None:
            return
        started, self.next_started = self.next_started, None
        kept = self.global_weights
        _, received, _ = self.collect(started, round_index)
        self.global_weights = kept
        self.state.traffic_bytes += self.transport.take_bytes() + received
        self.log.info("round %d was already under way when early stopping decided; its result is discarded",
                      round_index)

    # -- the NaN guard ------------------------------------------------------
    def on_non_finite(self, round_index: int, cause: str, before: np.ndarray) -> str:
        """Apply train.nan_policy to a round whose results are not finite."""
        policy = self.cfg.train.nan_policy
        if nan_guard.decide(policy, self.state.consecutive_rollbacks) == nan_guard.STOP:
            self.log.error("round %d: %s; stopping (train.nan_policy=%r, %d rollbacks in a row), keeping "
                           "the best weights", round_index, cause, policy, self.state.consecutive_rollbacks)
            self.global_weights = before
            return "nan"
        self.global_weights, checkpoint_round = self.last_good_weights()
        old_rate = self.learning_rate
        self.state.lr_scale /= 2
        self.state.consecutive_rollbacks += 1
        self.order_detail = {"learning_rate": self.learning_rate, "reset_optimizer": True}
        self.state.rollbacks.append({"round": round_index, "checkpoint_round": checkpoint_round,
                                     "learning_rate": self.learning_rate, "cause": cause})
        source = (f"the checkpoint of round {checkpoint_round}" if checkpoint_round >= 0
                  else "the initial weights")
        self.log.warning("round %d: %s; rolled back to %s, learning rate %g -> %g, optimizer state reset; "
                         "running round %d again", round_index, cause, source, old_rate, self.learning_rate,
                         round_index)
        return RETRY

    def last_good_weights(self) -> tuple[np.ndarray, int]:
        """The latest checkpoint's weights and round, or the initial weights (round -1) before one."""
        path = self.run_dir / CHECKPOINT_NAME
        if path.exists() or path.with_name(CHECKPOINT_NAME + ".bak").exists():
            arrays, meta = load_checkpoint(path)
            return arrays["weights"].astype(np.float32), int(meta["round"])
        return self.initial_weights.copy(), -1

    # -- rebalancing ----------------------------------------------------------
    def block_detail(self, worker: int) -> dict[str, Any]:
        """Every worker's block bounds this round, when blocks are rebalanced.

        All bounds travel (a few bytes each) because the weighted average needs every block's size.
        After a re-cut under scatter, ``moved_rows`` says how many training rows follow the order.
        """
        if self.rebalancer is None:
            return {}
        detail: dict[str, Any] = {"blocks": list(self.rebalancer.bounds)}
        if self.moved:
            detail["moved_rows"] = len(self.moved[worker])
        return detail

    def send_moved(self, worker: int, round_index: int) -> None:
        """Scatter: the rows that changed owner go to their new worker before it reads its block."""
        positions = self.moved[worker]
        try:
            nbytes = send_moved_rows(self.transport, self.dataset, worker, positions, self.worker_timeout)
        except TimeoutError:
            raise self.watchdog_failure(f"take its training rows for round {round_index}", [worker]) from None
        if len(positions):
            self.log.info("round %d: sent worker rank %d %d training rows that changed owner (%.2f MB)",
                          round_index, worker, len(positions), nbytes / 1e6)

    def rebalance(self, round_index: int, reports: list[Report]) -> None:
        """Re-cut the blocks from this round's throughput; the next round's orders carry the new bounds.

        Under scatter the rows that changed owner follow those orders (see :meth:`send_moved`).
        """
        if self.rebalancer is None:
            return
        rates = {r.rank - 1: (r.samples, r.train_seconds) for r in reports}
        if self.rebalancer.update(rates):
            self.plan.block_bounds = list(self.rebalancer.bounds)
            if self.ledger is not None:
                self.moved = self.ledger.recut(self.plan, round_index + 1)
            sizes = ", ".join(f"rank {w}: {end - start}" for w, (start, end)
                              in zip(self.workers, self.rebalancer.bounds))
            self.log.info("after round %d blocks re-cut by throughput (%s samples/s): %s", round_index,
                          ", ".join(f"{rate:.0f}" for rate in self.rebalancer.throughput), sizes)

    # -- collection and aggregation ------------------------------------------
    @property
    def worker_timeout(self) -> float | None:
        return self.cfg.watchdog.worker_timeout or None

    def remaining(self, started: float) -> float | None:
        """Seconds left of the watchdog's allowance for this round (None: no watchdog)."""
        if self.worker_timeout is None:
            return None
        return max(1e-3, started + self.worker_timeout - time.perf_counter())

    def watchdog_failure(self, what: str, ranks: list[int]) -> WorkerFailure:
        named = ", ".join(f"worker rank {rank} on host {self.hosts[rank]}" for rank in ranks)
        return WorkerFailure(f"watchdog: {named} did not {what} within watchdog.worker_timeout="
                             f"{self.worker_timeout:g} s; ending the job")

    def await_ready(self, started: float, round_index: int) -> None:
        """Every worker's "ready" for the round (its bytes reach us with its report)."""
        ready: set[int] = set()
        while len(ready) < len(self.workers):
            try:
                ready.add(self.transport.recv_object(tag=TAG_READY, timeout=self.remaining(started)).source)
            except TimeoutError:
                missing = sorted(set(self.workers) - ready)
                raise self.watchdog_failure(f"start round {round_index}", missing) from None

    def broadcast_weights(self, round_index: int) -> None:
        try:
            self.transport.broadcast(self.global_weights, timeout=self.worker_timeout)
        except TimeoutError:
            raise self.watchdog_failure(f"take the weights of round {round_index}", self.workers) from None

    def recv_reports(self, started: float, round_index: int) -> tuple[list[Report], int]:
        reports, received = [], 0
        for _ in self.workers:
            try:
                message = self.transport.recv_object(tag=TAG_REPORT, timeout=self.remaining(started))
            except TimeoutError:
                missing = sorted(set(self.workers) - {r.rank for r in reports})
                raise self.watchdog_failure(f"report round {round_index}", missing) from None
            reports.append(message.payload)
            received += message.nbytes + message.payload.bytes_before_report
        return sorted(reports, key=lambda r: r.rank), received

    def collect_reduced(self, started: float, round_index: int) -> tuple[list[Report], int, int]:
        """average / weighted: reports first (so the watchdog can name a missing rank), then one sum."""
        reports, received = self.recv_reports(started, round_index)
        summed = self.codec.empty()
        try:
            self.transport.reduce_sum(summed, timeout=self.worker_timeout)
        except TimeoutError:
            raise self.watchdog_failure("complete the weights reduction", self.workers) from None
        self.global_weights = summed
        self.aggregate_seconds = 0.0
        # Every worker put one model-sized buffer into the reduction.
        return reports, received + self.codec.nbytes * len(self.workers), -1

    def collect_best(self, started: float, round_index: int) -> tuple[list[Report], int, int]:
        """best: scores travel first, then only the winner's weights."""
        reports, received = self.recv_reports(started, round_index)
        started = time.perf_counter()
        winner = aggregation.elect({r.rank: (r.val_accuracy, r.val_loss) for r in reports})
        self.transport.send_object(Order(SEND_WEIGHTS, reports[0].round), winner, TAG_ORDER)
        try:
            message = self.transport.recv_array(self.codec.empty(), source=winner,
                                                timeout=self.worker_timeout)
        except TimeoutError:
            raise self.watchdog_failure(f"send its weights for round {round_index}", [winner]) from None
        self.global_weights = message.payload
        self.aggregate_seconds = time.perf_counter() - started
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in reports)
        self.log.info("round %d election: %s -> rank %d", reports[0].round, scores, winner)
        return reports, received + message.nbytes, winner

    # -- evaluation and records ---------------------------------------------
    def evaluate(self) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        self.model.set_weights(self.codec.unflatten(self.global_weights))
        batch = max(256, self.cfg.train.batch_size)
        result = evaluate_model(self.model, self.dataset.x_test, self.dataset.y_test, batch)
        out = {"test_loss": result["loss"], "test_accuracy": result["accuracy"]}
        if self.cfg.early_stopping.monitor.startswith("val_") and len(self.dataset.x_val):
            result = evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val, batch)
            out.update(val_loss=float(result["loss"]), val_accuracy=float(result["accuracy"]))
        return out, time.perf_counter() - started

    def round_row(self, round_index: int, reports: list[Report], received: int, winner: int,
                  evaluation: dict[str, float], elected: Report | None = None) -> dict[str, Any]:
        """One row of rounds.csv; ``elected`` is the winning report when ``winner`` sent more than one."""
        train_times = [r.train_seconds for r in reports]
        sent = received + self.discarded_bytes
        self.discarded_bytes = 0
        samples = sum(r.samples for r in reports)
        row = {
            "round": round_index,
            "train_seconds_max": max(train_times),
            "train_seconds_min": min(train_times),
            "aggregate_seconds": self.aggregate_seconds,
            "bytes": sent,
            "max_staleness": 0,
            "train_loss": sum(r.train_loss * r.samples for r in reports) / samples,
            "train_accuracy": sum(r.train_accuracy * r.samples for r in reports) / samples,
            "val_loss": math.nan,
            "val_accuracy": math.nan,
            "samples": samples,
            "winner": winner if winner >= 0 else "",
        }
        if winner >= 0:
            best = elected or next(r for r in reports if r.rank == winner)
            row.update(val_loss=best.val_loss, val_accuracy=best.val_accuracy)
        row.update(evaluation)
        return row

    def record(self, row: dict[str, Any]) -> None:
        self.state.traffic_bytes += row["bytes"]
        row["elapsed_seconds"] = self.elapsed()
        row["steps"] = self.state.steps
        self.state.rounds.append(row)
        self.round_log.write(row)
        self.log.info(format_round_line(row, self.cfg.train.epochs))
        write_json_atomic(self.run_dir / "summary.json", self.summary())

    def needs_final_checkpoint(self) -> bool:
        """False when the last round's checkpoint already holds what the end would write."""
        if not self.state.rounds:
            return False
        last, every = int(self.state.rounds[-1]["round"]), self.cfg.checkpoint.every
        written = every > 0 and (last + 1) % every == 0 and last >= self.start_round
        return not written or self.state.stop_reason in ("early_stopping", "nan")

    def gather_optimizer_states(self) -> dict[int, np.ndarray]:
        """Each worker's optimizer vector, for the checkpoint; none after a NaN (it may hold NaN)."""
        if self.state.stop_reason == "nan":
            return {}
        states, received = {}, 0
        for worker in self.workers:
            self.transport.send_object(Order(SEND_OPTIMIZER), worker, TAG_ORDER)
            try:
                message = self.transport.recv_object(worker, TAG_STATE, timeout=self.worker_timeout)
            except TimeoutError:
                raise self.watchdog_failure("send its optimizer state", [worker]) from None
            states[worker], received = message.payload, received + message.nbytes
        # Checkpoint traffic is counted in the run's total, not in the round's row.
        sent = self.transport.take_bytes() + received
        self.state.checkpoint_bytes += sent
        self.state.traffic_bytes += sent
        return states

    def maybe_checkpoint(self, round_index: int, force: bool = False,
                         states: dict[int, np.ndarray] | None = None) -> None:
        every = self.cfg.checkpoint.every
        if not force and (every <= 0 or (round_index + 1) % every):
            return
        arrays = {"weights": self.global_weights}
        if self.early.best_weights is not None:
            arrays["best_weights"] = self.early.best_weights
        states = self.gather_optimizer_states() if states is None else states
        arrays.update({f"{ARRAY_PREFIX}{rank}": vector for rank, vector in states.items()})
        meta = {"round": round_index, "rounds_completed": round_index + 1,
                "best_value": self.early.best_value, "best_round": self.early.best_round,
                "wait": self.early.wait, "monitor": self.early.monitor,
                "block_bounds": self.plan.block_bounds, "shuffle_seed": self.plan.shuffle_seed,
                "traffic_bytes": self.state.traffic_bytes, "config": self.cfg.to_dict(),
                "steps": self.state.steps, "lr_scale": self.state.lr_scale, "wall_seconds": self.elapsed(),
                "rollbacks": self.state.rollbacks, "workers": len(self.workers),
                "rng_seeds": {"train": self.cfg.train.seed, "shuffle": self.plan.shuffle_seed,
                              "workers": [worker_seed(self.cfg.train.seed, w, self.start_round)
                                          for w in self.workers]}}
        save_checkpoint(self.run_dir / "checkpoint.h5", arrays, meta)
        self.log.debug("checkpoint written after round %d", round_index)

    # -- the end ----------------------------------------------------------
    def release_workers(self) -> None:
        for worker in self.workers:
            self.transport.send_object(Order(STOP), worker, TAG_ORDER)
        self.state.traffic_bytes += self.transport.take_bytes()

    def final_round(self) -> dict[str, Any] | None:
        """The round whose weights are kept: the best one after an early or NaN stop, else the last."""
        rounds = self.state.rounds
        if self.state.stop_reason in ("early_stopping", "nan") and self.early.best_weights is not None:
            self.global_weights = self.early.best_weights
            return next(r for r in rounds if int(r["round"]) == self.early.best_round)
        return rounds[-1] if rounds else None

    def finish(self, states: dict[int, np.ndarray]) -> dict[str, Any]:
        final = self.final_round()
        self.model.set_weights(self.codec.unflatten(self.global_weights))
        self.model.save_weights(self.run_dir / "final.weights.h5")
        if self.needs_final_checkpoint():
            self.maybe_checkpoint(int(self.state.rounds[-1]["round"]), force=True, states=states)
        summary = self.summary(final)
        write_json_atomic(self.run_dir / "summary.json", summary)
        if self.state.rounds:
            self.log.info("per-round results:\n%s", format_table(self.state.rounds))
        accuracy = summary["final_test_accuracy"]
        self.log.info("done: %s after %d rounds, final test accuracy %s, %.1f s, %.2f MB sent; run "
                      "directory %s", summary["stop_reason"], summary["rounds_completed"],
                      "n/a" if accuracy is None else f"{accuracy:.4f}", summary["wall_seconds"],
                      summary["traffic_bytes"] / 1e6, self.run_dir)
        return summary

    def summary(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
        rounds = self.state.rounds
        final = final or (rounds[-1] if rounds else {})
        wait_wall = self.transport.wait_wall_seconds
        return {
            "rounds_completed": len(rounds),
            "final_round": final.get("round"),
            "final_test_accuracy": final.get("test_accuracy"),
            "final_test_loss": final.get("test_loss"),
            "best_test_accuracy": max((r["test_accuracy"] for r in rounds), default=None),
            "wall_seconds": self.elapsed(),
            "steps": self.state.steps,
            "learning_rate": self.learning_rate,
            "rollbacks": self.state.rollbacks,
            "resumed_after_round": self.start_round - 1 if self.start_round else None,
            "traffic_bytes": self.state.traffic_bytes,
            "checkpoint_bytes": self.state.checkpoint_bytes,
            "model_bytes": self.codec.nbytes,
            "stop_reason": self.state.stop_reason,
            "workers": len(self.workers),
            "aggregation": self.cfg.aggregation.method,
            "ssp": self.cfg.aggregation.ssp,
            "monitor": self.early.monitor,
            "best_round": self.early.best_round,
            "scheduler_wait_seconds": wait_wall,
            "scheduler_wait_cpu_seconds": self.transport.wait_cpu_seconds,
            "scheduler_wait_cpu_fraction": self.transport.wait_cpu_seconds / wait_wall if wait_wall else 0.0,
            "dataset": self.dataset.describe(),
        }
