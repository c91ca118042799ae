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

from mpi_trainer import aggregation
from mpi_trainer.checkpoint import save_checkpoint
from mpi_trainer.comm import TAG_ORDER, TAG_REPORT, Transport
from mpi_trainer.config import Config
from mpi_trainer.data.increment import log_data_shares
from mpi_trainer.data.sources import Dataset
from mpi_trainer.early_stopping import EarlyStopping
from mpi_trainer.logs import RoundLog, get_logger, write_json_atomic
from mpi_trainer.messages import ROUND, SEND_WEIGHTS, STOP, JobPlan, Order, Report
from mpi_trainer.rebalance import Rebalancer
from mpi_trainer.report import format_round_line, format_table
from mpi_trainer.ssp import idle_fraction
from mpi_trainer.weights import WeightCodec

ROUND_FIELDS = [
    "round", "wall_seconds", "train_seconds_max", "train_seconds_min", "comm_seconds",
    "aggregate_seconds", "eval_seconds", "bytes", "test_loss", "test_accuracy", "max_staleness",
    "train_loss", "train_accuracy", "val_loss", "val_accuracy", "samples", "winner", "elapsed_seconds",
    "idle_fraction", "block_sizes",
]


@dataclass
class RunState:
    """What the scheduler knows about the run so far."""

    rounds: list[dict[str, Any]] = field(default_factory=list)
    traffic_bytes: int = 0
    stop_reason: str = "running"


class Scheduler:
    def __init__(self, transport: Transport, cfg: Config, dataset: Dataset, model: Any,
                 plan: JobPlan, run_dir: Path) -> None:
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
        self.round_log = RoundLog(run_dir / "rounds.csv", ROUND_FIELDS)
        self.rebalancer = (Rebalancer(plan.block_bounds, cfg.data.rebalance_smoothing)
                           if cfg.data.rebalance else None)

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
            for round_index in range(self.cfg.train.epochs):
                if self.run_round(round_index):
                    self.state.stop_reason = "early_stopping"
                    break
            else:
                self.state.stop_reason = "epochs"
            self.release_workers()
            return self.finish()
        finally:
            self.round_log.close()

    def run_round(self, round_index: int) -> bool:
        """One synchronous round; returns True when early stopping says stop."""
        started = time.perf_counter()
        for worker in self.workers:
            order = Order(ROUND, round_index, self.block_detail(worker))
            self.transport.send_object(order, worker, TAG_ORDER)
        self.transport.broadcast(self.global_weights)
        if self.cfg.aggregation.method == "best":
            reports, received, winner = self.collect_best()
        else:
            reports, received, winner = self.collect_reduced()
        collected = time.perf_counter()
        self.check_finite(reports)
        log_data_shares(self.log, self.cfg.data.increment, round_index, reports, self.plan.num_train)
        evaluation, eval_seconds = self.evaluate()
        row = self.round_row(round_index, reports, received, winner, evaluation)
        wall = time.perf_counter() - started
        row.update(wall_seconds=wall, eval_seconds=eval_seconds,
                   comm_seconds=max(0.0, collected - started - row["train_seconds_max"]
                                    - row["aggregate_seconds"]),
                   idle_fraction=idle_fraction(wall, {r.rank: r.train_seconds for r in reports}),
                   block_sizes=";".join(str(r.samples) for r in reports))
        self.record(row)
        self.rebalance(round_index, reports)
        stop = self.early.update(round_index, row[self.cfg.early_stopping.monitor], self.global_weights)
        self.maybe_checkpoint(round_index)
        return stop

    # -- rebalancing ----------------------------------------------------------
    def block_detail(self, worker: int) -> dict[str, Any]:
        """Every worker's block bounds this round, when blocks are rebalanced.

        All bounds travel (a few bytes each) because the weighted average needs every block's size.
        """
        return {"blocks": list(self.rebalancer.bounds)} if self.rebalancer else {}

    def rebalance(self, round_index: int, reports: list[Report]) -> None:
        """Re-cut the blocks from this round's throughput; only the new bounds travel."""
        if self.rebalancer is None:
            return
        rates = {r.rank - 1: (r.samples, r.train_seconds) for r in reports}
        if self.rebalancer.update(rates):
            self.plan.block_bounds = list(self.rebalancer.bounds)
            sizes = ", ".join(f"rank {w}: {end - start}" for w, (start, end)
                              in zip(self.workers, self.rebalancer.bounds))
            self.log.info("after round %d blocks re-cut by throughput (%s samples/s): %s", round_index,
                          ", ".join(f"{rate:.0f}" for rate in self.rebalancer.throughput), sizes)

    # -- collection and aggregation ------------------------------------------
    def recv_reports(self) -> tuple[list[Report], int]:
        reports, received = [], 0
        for _ in self.workers:
            message = self.transport.recv_object(tag=TAG_REPORT)
            reports.append(message.payload)
            received += message.nbytes + message.payload.bytes_before_report
        return sorted(reports, key=lambda r: r.rank), received

    def collect_reduced(self) -> tuple[list[Report], int, int]:
        """average / weighted: workers pre-scale, one MPI sum-reduction aggregates."""
        summed = self.codec.empty()
        self.transport.reduce_sum(summed)
        started = time.perf_counter()
        self.global_weights = summed
        self.aggregate_seconds = time.perf_counter() - started
        reports, received = self.recv_reports()
        return reports, received, -1

    def collect_best(self) -> tuple[list[Report], int, int]:
        """best: scores travel first, then only the winner's weights."""
        reports, received = self.recv_reports()
        started = time.perf_counter()
        winner = aggregation.elect({r.rank: (r.val_accuracy, r.val_loss) for r in reports})
        self.transport.send_object(Order(SEND_WEIGHTS, reports[0].round), winner, TAG_ORDER)
        message = self.transport.recv_array(self.codec.empty(), source=winner)
        self.global_weights = message.payload
        self.aggregate_seconds = time.perf_counter() - started
        scores = ", ".join(f"rank {r.rank} {r.val_accuracy:.4f}" for r in reports)
        self.log.info("round %d election: %s -> rank %d", reports[0].round, scores, winner)
        return reports, received + message.nbytes, winner

    def check_finite(self, reports: list[Report]) -> None:
        if not np.all(np.isfinite(self.global_weights)):
            losses = {r.rank: r.train_loss for r in reports}
            raise FloatingPointError(f"aggregated weights are not finite; worker train losses: {losses}")

    # -- evaluation and records ---------------------------------------------
    def evaluate(self) -> tuple[dict[str, float], float]:
        started = time.perf_counter()
        self.model.set_weights(self.codec.unflatten(self.global_weights))
        batch = max(256, self.cfg.train.batch_size)
        result = self.model.evaluate(self.dataset.x_test, self.dataset.y_test, batch_size=batch,
                                     verbose=0, return_dict=True)
        out = {"test_loss": float(result["loss"]), "test_accuracy": float(result["accuracy"])}
        if self.cfg.early_stopping.monitor.startswith("val_") and len(self.dataset.x_val):
            result = self.model.evaluate(self.dataset.x_val, self.dataset.y_val, batch_size=batch,
                                         verbose=0, return_dict=True)
            out.update(val_loss=float(result["loss"]), val_accuracy=float(result["accuracy"]))
        return out, time.perf_counter() - started

    def round_row(self, round_index: int, reports: list[Report], received: int, winner: int,
                  evaluation: dict[str, float]) -> dict[str, Any]:
        train_times = [r.train_seconds for r in reports]
        sent = self.transport.take_bytes() + received
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
            best = next(r for r in reports if r.rank == winner)
            row.update(val_loss=best.val_loss, val_accuracy=best.val_accuracy)
        row.update(evaluation)
        return row

    def record(self, row: dict[str, Any]) -> None:
        self.state.traffic_bytes += row["bytes"]
        row["elapsed_seconds"] = time.perf_counter() - self.started
        self.state.rounds.append(row)
        self.round_log.write(row)
        self.log.info(format_round_line(row, self.cfg.train.epochs))
        write_json_atomic(self.run_dir / "summary.json", self.summary())

    def maybe_checkpoint(self, round_index: int, force: bool = False) -> None:
        every = self.cfg.checkpoint.every
        if not force and (every <= 0 or (round_index + 1) % every):
            return
        arrays = {"weights": self.global_weights}
        if self.early.best_weights is not None:
            arrays["best_weights"] = self.early.best_weights
        meta = {"round": round_index, "rounds_completed": round_index + 1,
                "best_value": self.early.best_value, "best_round": self.early.best_round,
                "wait": self.early.wait, "monitor": self.early.monitor,
                "block_bounds": self.plan.block_bounds, "shuffle_seed": self.plan.shuffle_seed,
                "traffic_bytes": self.state.traffic_bytes, "config": self.cfg.to_dict()}
        save_checkpoint(self.run_dir / "checkpoint.h5", arrays, meta)
        self.log.debug("checkpoint written after round %d", round_index)

    # -- the end ----------------------------------------------------------
    def release_workers(self) -> None:
        for worker in self.workers:
            self.transport.send_object(Order(STOP), worker, TAG_ORDER)
        self.state.traffic_bytes += self.transport.take_bytes()

    def final_round(self) -> dict[str, Any]:
        """The round whose weights are kept: the best one after an early stop, else the last."""
        if self.state.stop_reason == "early_stopping" and self.early.best_weights is not None:
            self.global_weights = self.early.best_weights
            return self.state.rounds[self.early.best_round]
        return self.state.rounds[-1]

    def finish(self) -> dict[str, Any]:
        final = self.final_round()
        self.model.set_weights(self.codec.unflatten(self.global_weights))
        self.model.save_weights(self.run_dir / "final.weights.h5")
        self.maybe_checkpoint(self.state.rounds[-1]["round"], force=True)
        summary = self.summary(final)
        write_json_atomic(self.run_dir / "summary.json", summary)
        self.log.info("per-round results:\n%s", format_table(self.state.rounds))
        self.log.info("done: %s after %d rounds, final test accuracy %.4f, %.1f s, %.2f MB sent; run "
                      "directory %s", summary["stop_reason"], summary["rounds_completed"],
                      summary["final_test_accuracy"], summary["wall_seconds"],
                      summary["traffic_bytes"] / 1e6, self.run_dir)
        return summary

    def summary(self, final: dict[str, Any] | None = None) -> dict[str, Any]:
        rounds = self.state.rounds
        final = final or rounds[-1]
        wait_wall = self.transport.wait_wall_seconds
        return {
            "rounds_completed": len(rounds),
            "final_round": final["round"],
            "final_test_accuracy": final["test_accuracy"],
            "final_test_loss": final["test_loss"],
            "best_test_accuracy": max(r["test_accuracy"] for r in rounds),
            "wall_seconds": time.perf_counter() - self.started,
            "traffic_bytes": self.state.traffic_bytes,
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
