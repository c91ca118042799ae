"""A training rank (ranks 1..N-1).

Separation of concerns: the scheduler owns the global weights, the block plan,
aggregation, evaluation, early stopping and every file in the run directory.
A worker owns its local model, its optimizer state and its block of the
training set. It waits for orders, trains one local epoch per round on its
block and hands back its weights and metrics, in the shape the aggregation
method wants (a scaled contribution to a reduction, or a scored candidate for
election). It never decides when to stop and never writes files. It makes no
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
from mpi_trainer.data.partition import shuffled_order
from mpi_trainer.data.sources import Dataset
from mpi_trainer.logs import get_logger
from mpi_trainer.messages import ROUND, SEND_OPTIMIZER, SEND_WEIGHTS, STOP, JobPlan, Report
from mpi_trainer.models import rebuild_model
from mpi_trainer.optimizer_state import ensure_built, load_state_vector, state_vector
from mpi_trainer.stop_at_step import steps_per_round
from mpi_trainer.weights import WeightCodec


class Worker:
    def __init__(self, transport: Transport, plan: JobPlan, dataset: Dataset, cfg: Config) -> None:
        self.transport = transport
        self.cfg = cfg
        self.log = get_logger()
        self.model = rebuild_model(plan.model)
        ensure_built(self.model)
        self.codec = WeightCodec.from_weights(self.model.get_weights())
        self.global_weights = self.codec.empty()
        self.candidate: np.ndarray | None = None
        self.dataset = dataset
        self.order = shuffled_order(plan.num_train, plan.shuffle_seed)
        self.set_block(plan.block_bounds[transport.rank - 1])
        self.total_samples = plan.num_train
        self.nan_injected = False

    def set_block(self, bounds: tuple[int, int]) -> None:
        start, end = bounds
        rows = np.sort(self.order[start:end])
        self.x, self.y = self.dataset.x_train[rows], self.dataset.y_train[rows]
        self.log.debug("block [%d, %d): %d samples", start, end, end - start)

    def run(self) -> None:
        """Serve orders until the scheduler says stop."""
        while True:
            order = self.transport.recv_object(0, TAG_ORDER).payload
            if order.kind == STOP:
                self.log.debug("stop received")
                return
            if order.kind == SEND_WEIGHTS:
                self.transport.send_array(self.candidate, 0)
            elif order.kind == SEND_OPTIMIZER:
                self.transport.send_object(state_vector(self.model.optimizer), 0, TAG_STATE)
            elif order.kind == ROUND:
                self.apply_detail(order.detail)
                self.run_round(order.round, order.detail.get("max_steps"))
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

    def train_once(self, max_steps: int | None) -> tuple[dict[str, Any], float, int]:
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
        history = self.model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=True)
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
                method, len(self.x), self.total_samples, self.transport.workers))
            self.transport.reduce_sum(local)
        self.log.debug("round %d: loss %.4f acc %.4f in %.2f s on %d samples", round_index,
                       report.train_loss, report.train_accuracy, train_seconds, report.samples)

    def score(self, report: Report) -> None:
        """Best-of election: score this round's weights on the shared validation split."""
        started = time.perf_counter()
        result = self.model.evaluate(self.dataset.x_val, self.dataset.y_val, verbose=0,
                                     batch_size=max(256, self.cfg.train.batch_size), return_dict=True)
        report.val_loss, report.val_accuracy = float(result["loss"]), float(result["accuracy"])
        report.eval_seconds = time.perf_counter() - started
