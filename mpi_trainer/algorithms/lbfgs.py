"""Full-batch L-BFGS over data blocks: the parts that need neither MPI nor Keras.

The objective is the mean loss over all N training samples,
``f(w) = (1/N) * sum_i loss_i(w)``. Each worker returns the *sum* of its
block's losses and the sum of their gradients, so the blocks' contributions
add up to the same total however the rows are split; dividing by N once, on
the scheduler, gives ``f`` and its gradient. :func:`minimize` drives SciPy's
L-BFGS-B over any ``evaluate(params) -> (loss, gradient)`` callable and
reports every accepted iterate; :class:`WireLayout` says where parameters,
sums and timings sit in the two float64 buffers of one evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.optimize

EVALUATE = 1.0  # the request buffer's leading element: compute at these parameters
STOP = 0.0  # ... or leave the evaluation loop
PREEMPTED = -1.0  # ... or leave it because the job was preempted (it exits 75 on every rank)

Objective = Callable[[np.ndarray], tuple[float, np.ndarray]]


@dataclass(frozen=True)
class LbfgsSettings:
    """Limits and tolerances, named as in the config; :meth:`scipy_options` translates them."""

    max_iterations: int
    history_size: int = 10
    gtol: float = 1e-5
    ftol: float = 2.220446049250313e-09
    max_evaluations: int = 15000

    def scipy_options(self) -> dict[str, float | int]:
        return {"maxiter": self.max_iterations, "maxcor": self.history_size, "gtol": self.gtol,
                "ftol": self.ftol, "maxfun": self.max_evaluations}


@dataclass
class Iterate:
    """One accepted L-BFGS iterate: its index from 0, parameters, mean loss and evaluations so far."""

    iteration: int
    params: np.ndarray
    loss: float
    evaluations: int


@dataclass
class LbfgsResult:
    """How a run ended. ``reason``: epochs, max_evaluations, converged, early_stopping, nan or abnormal."""

    params: np.ndarray
    loss: float
    iterations: int
    evaluations: int
    reason: str
    message: str


class NonFiniteObjective(FloatingPointError):
    """The loss or gradient came back NaN or infinite; L-BFGS cannot go on from there."""


class CountingObjective:
    """Wraps ``evaluate``: counts calls and refuses non-finite results.

    SciPy's L-BFGS-B reports "convergence" when handed a NaN loss, so the
    check has to happen here.
    """

    def __init__(self, evaluate: Objective) -> None:
        self.evaluate = evaluate
        self.evaluations = 0

    def __call__(self, params: np.ndarray) -> tuple[float, np.ndarray]:
        loss, gradient = self.evaluate(params)
        self.evaluations += 1
        if not (math.isfinite(loss) and np.all(np.isfinite(gradient))):
            raise NonFiniteObjective(f"evaluation {self.evaluations}: loss {loss}, "
                                     f"{int(np.sum(~np.isfinite(gradient)))} non-finite gradient entries")
        return float(loss), np.asarray(gradient, dtype=np.float64)


def stop_reason(result: scipy.optimize.OptimizeResult, settings: LbfgsSettings, stopped: bool) -> str:
    """Our name for why SciPy returned (status 1 covers both the iteration and the evaluation limit)."""
    if stopped:
        return "early_stopping"
    if result.status == 0:
        return "converged"
    if result.status == 1:
        return "epochs" if result.nit >= settings.max_iterations else "max_evaluations"
    return "abnormal"


def minimize(evaluate: Objective, x0: np.ndarray, settings: LbfgsSettings,
             on_iteration: Callable[[Iterate], bool] | None = None, first_iteration: int = 0) -> LbfgsResult:
    """Run L-BFGS-B from ``x0``; ``on_iteration`` sees every accepted iterate and returns True to stop.

    ``first_iteration`` numbers the iterates of a run that continues an earlier one.
    """
    objective = CountingObjective(evaluate)
    last = Iterate(first_iteration - 1, np.array(x0, dtype=np.float64), math.nan, 0)
    stopped = False

    def callback(intermediate_result: scipy.optimize.OptimizeResult) -> None:
        nonlocal last, stopped
        last = Iterate(last.iteration + 1, intermediate_result.x.copy(), float(intermediate_result.fun),
                       objective.evaluations)
        if on_iteration is not None and on_iteration(last):
            stopped = True
            raise StopIteration  # SciPy ends the run and returns this iterate

    try:
        result = scipy.optimize.minimize(objective, last.params, jac=True, method="L-BFGS-B",
                                         callback=callback, options=settings.scipy_options())
    except NonFiniteObjective as exc:
        return LbfgsResult(last.params, last.loss, last.iteration - first_iteration + 1, objective.evaluations,
                       "nan", str(exc))
    return LbfgsResult(result.x, float(result.fun), last.iteration - first_iteration + 1, objective.evaluations,
                   stop_reason(result, settings, stopped), str(result.message))


@dataclass
class BlockSums:
    """What one evaluation's reduction carries: sums over every block, and each worker's seconds."""

    loss_sum: float
    samples: int
    seconds: np.ndarray
    gradient_sum: np.ndarray

    def mean(self) -> tuple[float, np.ndarray]:
        """The objective and its gradient: the sums divided by the number of samples."""
        if self.samples <= 0:
            raise ValueError(f"no samples in the reduction (received {self.samples})")
        return self.loss_sum / self.samples, self.gradient_sum / self.samples


@dataclass(frozen=True)
class WireLayout:
    """The two float64 buffers of one evaluation.

    request (scheduler -> all, broadcast): ``[flag, params...]`` with flag
    :data:`EVALUATE`, :data:`STOP` or :data:`PREEMPTED`.
    contribution (all -> scheduler, sum-reduced):
    ``[loss_sum, samples, seconds_1 .. seconds_W, gradient_sum...]``; worker
    ``r`` writes its compute seconds into slot ``r`` only, so the sum delivers
    every worker's time in the same round trip. The scheduler contributes zeros.
    """

    num_params: int
    workers: int

    @property
    def header(self) -> int:
        return 2 + self.workers

    def request(self) -> np.ndarray:
        return np.zeros(1 + self.num_params, dtype=np.float64)

    def fill_request(self, request: np.ndarray, params: np.ndarray | None, preempted: bool = False) -> None:
        """``params`` to evaluate at, or None for the stop request (``preempted``: the job's preemption)."""
        request[0] = EVALUATE if params is not None else PREEMPTED if preempted else STOP
        if params is not None:
            request[1:] = params

    def contribution(self) -> np.ndarray:
        return np.zeros(self.header + self.num_params, dtype=np.float64)

    def gradient_slot(self, contribution: np.ndarray) -> np.ndarray:
        """The view a worker's gradient sum is written into."""
        return contribution[self.header:]

    def fill_header(self, contribution: np.ndarray, rank: int, loss_sum: float, samples: int,
                    seconds: float) -> None:
        contribution[0], contribution[1] = loss_sum, samples
        contribution[2:self.header] = 0.0
        contribution[1 + rank] = seconds

    def unpack(self, contribution: np.ndarray) -> BlockSums:
        return BlockSums(float(contribution[0]), int(round(contribution[1])),
                         contribution[2:self.header].copy(), contribution[self.header:])
