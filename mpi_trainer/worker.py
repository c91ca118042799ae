"""A training rank (ranks 1..N-1).

Separation of concerns: the scheduler owns the global weights, the block plan,
aggregation, evaluation, early stopping and every file in the run directory.
A worker owns its local model, its optimizer state and its block of the
training set. It waits for orders, trains one local epoch per round on its
block and hands back its weights and metrics, in the shape the aggregation
method wants (a scaled contribution to a reduction, or a scored candidate for
election; under SSP, its weights point to point). With rebalancing the order
names the block to train on, and under scatter the rows that changed owner
follow it. It never decides when to stop and never writes files. It makes no
MPI calls of its own: everything goes through :class:`~mpi_trainer.comm.Transport`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from mpi_trainer import aggregation
from mpi_trainer.comm import TAG_ORDER, TAG_READY, TAG_REPORT, TAG_STATE, Transport
from mpi_trainer.config import Config
from mpi_trainer.data.feed import fit_arguments
from mpi_trainer.data.placement import WorkerData, peak_rss_mib, receive_moved_rows
from mpi_trainer.data.sources import Dataset
from mpi_trainer.logs import get_logger
from mpi_trainer.messages import ROUND, SEND_OPTIMIZER, SEND_WEIGHTS, STOP, UPDATE, JobPlan, Order, Report
from mpi_trainer.models import evaluate_model, rebuild_model
from mpi_trainer.optimizer_state import ensure_built, load_state_vector, state_vector
from mpi_trainer.resume import worker_seed
from mpi_trainer.slowdown import make_slowdown
from mpi_trainer.stop_at_step import steps_per_round
from mpi_trainer.weights import WeightCodec


class Worker:
    def __init__(self, transport: Transport, plan: JobPlan, dataset: Dataset, cfg: Config,
                 data: WorkerData | None = None) -> None:
        self.transport = transport
        self.cfg = cfg
        self.log = get_logger()
        self.model = rebuild_model(plan.model)
        ensure_built(self.model)
        self.codec = WeightCodec.from_weights(self.model.get_weights())
        self.global_weights = self.codec.empty()
        self.candidate: np.ndarray | None = None
        self.dataset = dataset
        # The block (and, with increment, each round's draw) comes from the data placement.
        self.data = data if data is not None else WorkerData(dataset.train, plan, transport.rank, cfg)
        self.x, self.y = self.data.fixed_x, self.data.fixed_y
        self.slowdown = make_slowdown(cfg.debug, transport.rank)
        self.shuffle_rng = np.random.default_rng(worker_seed(cfg.train.seed, transport.rank, plan.start_round))
        self.nan_injected = False

    def run(self) -> None:
        """Serve orders until the scheduler says stop."""
        while True:
            order = self.transport.recv_object(0, TAG_ORDER).payload
            if order.kind == STOP:
                self.log.debug("stop received; peak RSS %.1f MiB", peak_rss_mib())
                return
            if order.kind == SEND_WEIGHTS:
                self.transport.send_array(self.candidate, 0)
            elif order.kind == SEND_OPTIMIZER:
                self.transport.send_object(state_vector(self.model.optimizer), 0, TAG_STATE)
            elif order.kind == ROUND:
                self.follow_blocks(order)
                self.apply_detail(order.detail)
                self.run_round(order.round, order.detail.get("max_steps"))
            elif order.kind == UPDATE:
                self.run_update(order)
            else:
                raise RuntimeError(f"unknown order {order.kind!r} from the scheduler")

    def apply_detail(self, detail: dict[str, Any]) -> None:
        """Optimizer changes the scheduler asks for before a round (NaN rollback, resume)."""
        optimizer = self.model.optimizer
        if detail.get("optimizer_state"):
            load_state_vector(optimizer, self.transport.recv_object(0, TAG_STATE).payload)
        if detail.get("reset_optimizer"):
            # Moments computed from non-finite gradients would poison the next round.
            for variable in optimizer.variables:
                if "learning_rate" not in variable.path:
                    variable.assign(np.zeros(variable.shape, dtype=variable.dtype))
        if "learning_rate" in detail:
            optimizer.learning_rate = detail["learning_rate"]
            self.log.debug("learning rate set to %g", detail["learning_rate"])

    def train_once(self, max_steps: int | None = None) -> tuple[dict[str, Any], float, int]:
        """One local epoch on the block (or ``max_steps`` batches of it); metrics, seconds, steps."""
        self.model.set_weights(self.codec.unflatten(self.global_weights))
        batch = self.cfg.train.batch_size
        x, y = self.x, self.y
        if max_steps is not None:
            if max_steps == 0:
                return {}, 0.0, 0
            seed = self.cfg.train.seed + self.transport.rank
            rows = np.random.default_rng(seed).permutation(len(x))[:max_steps * batch]
            x, y = x[rows], y[rows]
        started = time.perf_counter()
        callbacks = [self.slowdown] if self.slowdown is not None else None
        history = self.model.fit(**fit_arguments(x, y, batch, self.shuffle_rng), epochs=1, verbose=0,
                                 callbacks=callbacks)
        metrics = {k: float(v[-1]) for k, v in history.history.items()}
        return metrics, time.perf_counter() - started, steps_per_round(len(x), batch)

    def maybe_inject_nan(self, round_index: int, local: np.ndarray) -> None:
        """Test hook (debug.nan_rank / debug.nan_round): poison this rank's weights once."""
        debug = self.cfg.debug
        if debug.nan_rank == self.transport.rank and debug.nan_round == round_index and not self.nan_injected:
            self.log.warning("debug: injecting NaN into the weights of round %d", round_index)
            local[:] = np.nan
            self.nan_injected = True

    def run_round(self, round_index: int, max_steps: int | None = None) -> None:
        self.transport.take_bytes()
        # "ready": lets the scheduler's watchdog name a rank that stopped before the broadcast.
        self.transport.send_object(round_index, 0, TAG_READY)
        self.transport.broadcast(self.global_weights)
        self.x, self.y = self.data.for_round(round_index)
        metrics, train_seconds, steps = self.train_once(max_steps)
        local = self.codec.flatten(self.model.get_weights())
        self.maybe_inject_nan(round_index, local)
        loss = metrics.get("loss", 0.0 if not steps else math.nan)
        report = Report(self.transport.rank, round_index, len(self.x), loss,
                        metrics.get("accuracy", math.nan), train_seconds, steps=steps,
                        weights_finite=bool(np.all(np.isfinite(local))))
        method = self.cfg.aggregation.method
        if method == "best":
            self.score(report)
            self.candidate = local
        report.bytes_before_report = self.transport.take_bytes()
        # The report goes first, so a scheduler that times out knows which rank is missing.
        self.transport.send_object(report, 0, TAG_REPORT)
        if method != "best":
            local *= np.float32(aggregation.contribution_scale(
                method, len(self.x), self.data.round_total(round_index), self.transport.workers))
            self.transport.reduce_sum(local)
        self.log.debug("round %d: loss %.4f acc %.4f in %.2f s on %d samples", round_index,
                       report.train_loss, report.train_accuracy, train_seconds, report.samples)

    def follow_blocks(self, order: Order) -> None:
        """Rebalancing: adopt the blocks the scheduler re-cut for this round.

        Under scatter the rows that changed owner follow the order; otherwise only bounds travel.
        """
        blocks = order.detail.get("blocks")
        if blocks is None:
            return
        if "moved_rows" in order.detail:
            self.data.take_rows(receive_moved_rows(self.transport), blocks, order.round)
        if self.data.set_blocks(blocks):
            self.log.debug("round %d: block now [%d, %d)", order.round, *blocks[self.transport.rank - 1])

    def run_update(self, order: Order) -> None:
        """SSP: receive the current global weights, train once, send the report and the weights back."""
        self.transport.take_bytes()
        self.transport.recv_array(self.global_weights, source=0)
        self.x, self.y = self.data.for_round(order.round)
        metrics, train_seconds, steps = self.train_once()
        report = Report(self.transport.rank, order.round, len(self.x), metrics.get("loss", math.nan),
                        metrics.get("accuracy", math.nan), train_seconds, steps=steps)
        if self.cfg.aggregation.method == "best":
            self.score(report)
        self.transport.send_object(report, 0, TAG_REPORT)
        self.transport.send_array(self.codec.flatten(self.model.get_weights()), 0)

    def score(self, report: Report) -> None:
        """Best-of election: score this round's weights on the shared validation split."""
        started = time.perf_counter()
        result = evaluate_model(self.model, self.dataset.x_val, self.dataset.y_val,
                                max(256, self.cfg.train.batch_size))
        report.val_loss, report.val_accuracy = float(result["loss"]), float(result["accuracy"])
        report.eval_seconds = time.perf_counter() - started
