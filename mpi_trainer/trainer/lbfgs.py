"""Full-batch L-BFGS (``model.optimizer = "lbfgs"``) of the model every rank holds.

Separation of concerns: SciPy's L-BFGS-B owns the search (directions, line search, curvature history;
:func:`~mpi_trainer.algorithms.lbfgs.minimize`); each worker computes the loss sum and gradient sum of its
share of the training arrays at the parameters rank 0 asks for
(:class:`~mpi_trainer.models.gradients.BlockGradient`); rank 0 owns the iterates and runs them through the
fit loop every way of training shares (:class:`~.epochs.EpochDriver`: the Keras callbacks, scoring, the run
directory's :class:`~.run_record.FitRecord`, checkpoints, stops). An
accepted iterate plays the part of an epoch: it is one entry of the History and one row of rounds.csv,
with the function evaluations it took and the gradient's largest component.

One function evaluation is one broadcast of ``[flag, params]`` (float64) and one sum-reduction of
``[loss_sum, samples, seconds per worker, gradient_sum]`` (float64,
:class:`~mpi_trainer.algorithms.lbfgs.WireLayout`). The whole state goes to the workers in float32 before
the first request (so that the non-trainable state matches rank 0's) and after the stop request (the final
state, on every rank).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.algorithms.lbfgs import EVALUATE, PREEMPTED, Iterate, LbfgsSettings, WireLayout, minimize
from mpi_trainer.errors import Preempted
from mpi_trainer.trainer.epochs import EpochDriver
from mpi_trainer.trainer.round_protocol import Report

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport
    from mpi_trainer.config import Config
    from mpi_trainer.persistence.preemption import Preemption
    from mpi_trainer.trainer.run_record import FitRecord
    from mpi_trainer.trainer.state import ModelState


def settings_from(cfg: Config, iterations: int) -> LbfgsSettings:
    options = cfg.lbfgs
    return LbfgsSettings(iterations, options.history_size, options.gtol, options.ftol, options.max_evaluations)


def lbfgs_refusal(train_data: tuple[Any, Any, Any], kwargs: dict[str, Any]) -> str | None:
    """Why this fit's data cannot be trained by full-batch L-BFGS, or None: it needs the training rows as
    arrays, one input and one target, unweighted (its objective is the mean loss over every row)."""
    x, y, weights = train_data
    for name, given in (("sample_weight", weights), ("class_weight", kwargs.get("class_weight"))):
        if given is not None:
            return (f"`model.optimizer = 'lbfgs'` minimises the mean loss over every training row, unweighted. "
                    f"Received: {name}; expected {name}=None, or a Keras optimizer")
    if not isinstance(x, np.ndarray) or not isinstance(y, np.ndarray):
        return ("`model.optimizer = 'lbfgs'` computes full-batch gradients of training rows held as arrays. "
                f"Received: x of type {type(x).__name__}, y of type {type(y).__name__}; expected NumPy arrays, "
                f"or a Keras optimizer")
    return None


class LbfgsWorker:
    """A worker: its rows' loss sum and gradient sum at each point rank 0 asks for, until the stop request."""

    def __init__(self, transport: RankTransport, model: Any, state: ModelState, share: dict[str, Any],
                 batch_size: int) -> None:
        from mpi_trainer.models.gradients import BlockGradient

        self.transport, self.state = transport, state
        self.gradient = BlockGradient(model, state.trainable, batch_size)
        self.layout = WireLayout(self.gradient.size, transport.size - 1)
        self.x, self.y = share["x"], share["y"]

    def run(self) -> None:
        flat = self.state.empty()
        self.transport.broadcast(flat)
        self.state.write(flat)
        request, contribution = self.layout.request(), self.layout.contribution()
        while True:
            self.transport.broadcast(request)
            if request[0] != EVALUATE:
                break
            started = time.perf_counter()
            self.state.write_trainable(request[1:])
            loss_sum, _ = self.gradient(self.x, self.y, out=self.layout.gradient_slot(contribution))
            self.layout.fill_header(contribution, self.transport.rank, loss_sum, len(self.x),
                                    time.perf_counter() - started)
            self.transport.reduce_sum(contribution)
        self.transport.broadcast(flat)  # the final state
        self.state.write(flat)
        if request[0] == PREEMPTED:
            raise Preempted()


class LbfgsScheduler:
    """Rank 0: drives L-BFGS-B over the workers' sums; each accepted iterate is scored, recorded and shown to
    the callbacks as an epoch."""

    def __init__(self, transport: RankTransport, model: Any, state: ModelState, cfg: Config, callbacks: Any,
                 validation: dict[str, Any] | None, validation_freq: Any, record: FitRecord, rows: int,
                 preemption: Preemption, blocks: list[int] | None = None, evaluations_before: int = 0) -> None:
        """``blocks``: each worker's rows (default: as even as they divide); ``evaluations_before``: a resumed
        run's function evaluations before this job."""
        from mpi_trainer.models.gradients import check_trainable

        self.transport, self.model, self.state, self.cfg = transport, model, state, cfg
        self.record, self.rows, self.preemption = record, rows, preemption
        self.driver = EpochDriver(model, callbacks, record, state, preemption, validation, validation_freq)
        self.blocks = blocks or [rows // (transport.size - 1)] * (transport.size - 1)  # each worker's rows
        self.workers = transport.size - 1
        check_trainable(model, state.trainable)
        self.layout = WireLayout(state.trainable_size, self.workers)
        self.request = self.layout.request()
        self.evaluations = 0  # this job's, and (resumed) the run's before it
        self.evaluations_before = evaluations_before
        self.worker_seconds = np.zeros(self.workers)
        self.evaluate_seconds = 0.0
        self.sent = 0  # the workers' bytes since the last iterate was recorded
        self.started = time.perf_counter()
        self.last_gradient: tuple[np.ndarray, np.ndarray] | None = None
        self.preempted = False
        self.message = "no iterations left"

    def run(self, first: int, iterations: int) -> None:
        """Iterations ``first`` .. ``iterations - 1``, then the workers are released with the final state."""
        flat = self.state.read(self.state.empty())
        self.transport.broadcast(flat)
        self.record.count_bytes(self.transport.take_bytes())
        self.record.log.info("full-batch L-BFGS: %d workers, %d trainable parameters, at most %d iterations and "
                             "%d function evaluations", self.workers, self.state.trainable_size, iterations,
                             self.cfg.lbfgs.max_evaluations)
        reason = "epochs"
        if iterations > first:
            self.driver.begin()
            self.started = time.perf_counter()
            outcome = minimize(self.evaluate, self.state.read_trainable(), settings_from(self.cfg, iterations - first),
                               self.on_iteration, first)
            reason, self.message = outcome.reason, outcome.message
            if not self.preempted:  # a preempted fit goes on in the next job: its training has not ended
                self.driver.end({}, None)
        self.record.stopped("preempted" if self.preempted else reason)
        if reason in ("nan", "abnormal"):
            self.record.warn(f"L-BFGS stopped: {self.message}")
        self.request[0] = PREEMPTED if self.preempted else 0.0
        self.transport.broadcast(self.request)
        self.transport.broadcast(self.state.read(flat))
        self.record.count_bytes(self.transport.take_bytes())
        self.record.describe.update(function_evaluations=self.evaluations, optimizer_message=self.message,
                                    parameter_bytes=self.state.trainable_size * 8)

    def evaluate(self, params: np.ndarray) -> tuple[float, np.ndarray]:
        """One round trip: the mean loss and gradient over every worker's rows at ``params``."""
        started = time.perf_counter()
        self.layout.fill_request(self.request, params)
        self.transport.broadcast(self.request)
        contribution = self.layout.contribution()  # rank 0 adds zeros
        self.transport.reduce_sum(contribution)
        sums = self.layout.unpack(contribution)
        if sums.samples != self.rows:
            raise RuntimeError(f"the workers summed over {sums.samples} rows; their shares hold {self.rows}")
        self.sent += contribution.nbytes * self.workers  # each worker's sums: its transport counts them, not ours
        self.evaluate_seconds += time.perf_counter() - started
        self.worker_seconds += sums.seconds
        loss, gradient = sums.mean()
        self.last_gradient = (params.copy(), gradient)
        return loss, gradient

    def on_iteration(self, iterate: Iterate) -> bool:
        """An accepted iterate as an epoch: scored, recorded, checkpointed when due, shown to the callbacks;
        True ends the run (a callback's ``stop_training``, or a preemption signal)."""
        ended = time.perf_counter()
        self.driver.begin_epoch(iterate.iteration)
        self.state.write_trainable(iterate.params)
        logs = {"loss": iterate.loss}
        scoring = time.perf_counter()
        if self.driver.due(iterate.iteration):
            logs.update(self.driver.score())
        self.evaluations = self.evaluations_before + iterate.evaluations
        slowest = float(self.worker_seconds.max())
        # the round trips beyond the slowest worker's computing, and L-BFGS's own work between them
        times = {"comm_seconds": max(0.0, self.evaluate_seconds - slowest),
                 "aggregate_seconds": max(0.0, ended - self.started - self.evaluate_seconds),
                 "eval_seconds": time.perf_counter() - scoring, "bytes": self.transport.take_bytes() + self.sent,
                 "function_evaluations": self.evaluations, "gradient_norm": self.gradient_norm(iterate.params)}
        reports = [Report({}, 0, rows, float(seconds), [], worker=index + 1)
                   for index, (rows, seconds) in enumerate(zip(self.blocks, self.worker_seconds))]
        self.driver.end_epoch(iterate.iteration, logs, reports, times, self.started)
        self.preempted = self.driver.preempting
        self.worker_seconds[:], self.evaluate_seconds, self.sent, self.started = 0.0, 0.0, 0, time.perf_counter()
        return self.driver.stop_reason(self.preempted) is not None

    def gradient_norm(self, params: np.ndarray) -> float:
        """The largest gradient component at ``params`` (what ``lbfgs.gtol`` bounds), if it was evaluated there."""
        if self.last_gradient is None or not np.array_equal(self.last_gradient[0], params):
            return math.nan
        return float(np.max(np.abs(self.last_gradient[1])))
