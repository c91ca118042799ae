"""A worker rank under full-batch L-BFGS (``model.optimizer = "lbfgs"``).

Separation of concerns: the scheduler owns the parameters, SciPy's L-BFGS
state, evaluation, early stopping and every file. A worker owns its model and
its fixed block of the training set. It takes the scheduler's full weights
once (so non-trainable state matches), then serves evaluations: each is one
broadcast of ``[flag, params]`` and one sum-reduction of
``[loss_sum, samples, seconds per worker, gradient_sum]`` (see
:class:`~mpi_trainer.algorithms.lbfgs.WireLayout`). It makes no MPI calls of
its own and never decides when to stop: a request with the stop flag ends it
(the preemption flag also makes it exit 75 with the scheduler).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpi_trainer.algorithms.lbfgs import EVALUATE, PREEMPTED, WireLayout
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import JobPlan, WorkerLink
from mpi_trainer.config import Config
from mpi_trainer.logs import get_logger
from mpi_trainer.models import rebuild_model
from mpi_trainer.models.gradients import BlockGradient


def receive_initial_weights(link: WorkerLink, model: Any) -> None:
    """The scheduler's weights (all of them, float32), broadcast once before the first evaluation."""
    codec = WeightCodec.from_weights(model.get_weights())
    weights = codec.empty()
    link.recv_broadcast(weights)
    codec.load(model, weights)


class LbfgsWorker:
    def __init__(self, link: WorkerLink, plan: JobPlan, cfg: Config, x: np.ndarray, y: np.ndarray) -> None:
        self.link = link
        self.model = rebuild_model(plan.model)
        self.gradient = BlockGradient(self.model, cfg.lbfgs.batch_size)
        self.layout = WireLayout(self.gradient.size, link.workers)
        self.x, self.y = x, y
        self.evaluations = 0
        self.preempted = False  # the stop request said the job was preempted: this rank exits 75 too

    def run(self) -> None:
        """Serve evaluations until the stop flag arrives."""
        receive_initial_weights(self.link, self.model)
        request = self.layout.request()
        contribution = self.layout.contribution()
        while True:
            self.link.recv_broadcast(request)
            if request[0] != EVALUATE:
                self.preempted = bool(request[0] == PREEMPTED)
                get_logger().debug("stop received after %d evaluations", self.evaluations)
                return
            self.contribute(request[1:], contribution)
            self.link.contribute(contribution)

    def contribute(self, params: np.ndarray, contribution: np.ndarray) -> None:
        """This block's loss sum and gradient sum at ``params``, with its sample count and seconds."""
        started = time.perf_counter()
        loss_sum, _ = self.gradient(params, self.x, self.y, out=self.layout.gradient_slot(contribution))
        seconds = time.perf_counter() - started
        self.layout.fill_header(contribution, self.link.rank, loss_sum, len(self.x), seconds)
        self.evaluations += 1
        get_logger().debug("evaluation %d: loss sum %.6g over %d samples in %.3f s", self.evaluations,
                           loss_sum, len(self.x), seconds)
