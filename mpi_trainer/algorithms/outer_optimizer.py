"""Outer optimizers: the step the scheduler takes from the round's aggregate to the next global model.

Plain model averaging makes the aggregate the next global model. An outer
optimizer treats the round's change as a gradient instead: the
pseudo-gradient ``delta = w_global - aggregate`` (the step the workers took,
averaged, pointing uphill like a gradient) goes into SGD with momentum
(SlowMo), Nesterov momentum (DiLoCo) or Adam (FedAdam), and that optimizer
moves ``w_global``. Only the model's trainable weights take that step; the
non-trainable ones (BatchNormalization's moving statistics) take the aggregate.
Everything here is pure NumPy over flat float32 vectors, in place; the state is
a dict of named arrays over the trainable positions, so a checkpoint stores it
as it is.

Conventions (those of Keras' ``SGD`` and ``Adam``):

* ``momentum``: ``v = mu * v + delta``; ``w = w - lr * v``.
* ``nesterov``: ``v = mu * v + delta``; ``w = w - lr * (delta + mu * v)``.
* ``adam``: ``m = b1 * m + (1 - b1) * delta``, ``s = b2 * s + (1 - b2) * delta**2``,
  ``w = w - lr * m_hat / (sqrt(s_hat) + eps)`` with bias-corrected ``m_hat``, ``s_hat``.

The SGD updates are written ``w = aggregate - (lr * step - delta)``, which is
``w - lr * step`` rearranged: at ``lr = 1`` without momentum the bracket is
exactly zero and the aggregate comes out bit for bit, as plain averaging gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from mpi_trainer.algorithms.passes import CHUNK, default_threads, in_parallel
from mpi_trainer.config.schema import OUTER_OPTIMIZERS, Config
from mpi_trainer.logs import get_logger

STATE_PREFIX = "outer_"  # the state's arrays in a checkpoint: outer_velocity, outer_m, ...


@dataclass(frozen=True)
class OuterSettings:
    """What ``aggregation.outer_*`` configures."""

    name: str = "none"
    learning_rate: float = 1.0
    momentum: float = 0.5
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7

    @classmethod
    def from_config(cls, cfg: Config, workers: int) -> OuterSettings:
        """The outer optimizer in effect with ``workers`` workers (``"auto"`` resolved), and
        ``aggregation.outer_*``."""
        section = cfg.aggregation
        return cls(cfg.outer_optimizer_for(workers), section.outer_learning_rate,
                   section.outer_momentum, section.outer_beta_1, section.outer_beta_2, section.outer_epsilon)

    def describe(self) -> str:
        if self.name == "none":
            return "outer optimizer none (the aggregate is the next global model)"
        extra = (f"beta_1 {self.beta_1:g}, beta_2 {self.beta_2:g}, epsilon {self.epsilon:g}" if self.name == "adam"
                 else f"momentum {self.momentum:g}")
        return f"outer optimizer {self.name} (learning rate {self.learning_rate:g}, {extra})"


class OuterOptimizer:
    """Moves the global weights from each round's aggregate; holds its state between rounds.

    ``trainable``: the ``(start, stop)`` spans of the flat vector that the outer step moves (the
    model's trainable weights, :attr:`~mpi_trainer.trainer.state.ModelState.trainable_size`);
    None moves every position. Everything else (BatchNormalization's moving mean and variance, a
    frozen layer) takes the round's aggregate as it is: those values are statistics or constants,
    not parameters, and a momentum step on them can drive a variance negative. The state arrays
    hold the trainable positions only, in order.

    The step runs in place over chunks of a few hundred kilobytes: each chunk is read once from the
    weights, the aggregate and the state and written once to the state and the result, with the
    arithmetic on cache-resident scratch buffers, so a round costs one pass over the model and
    allocates nothing of its size after the first.
    """

    def __init__(self, settings: OuterSettings, trainable: Sequence[tuple[int, int]] | None = None,
                 threads: int | None = None) -> None:
        named = [name for name in OUTER_OPTIMIZERS if name != "auto"]  # "auto" is resolved by the config
        if settings.name not in named:
            raise ValueError(f"outer optimizer must be one of {named}. Received: name={settings.name!r}")
        self.settings = settings
        self.trainable = None if trainable is None else merge_spans(trainable)
        self.state: dict[str, np.ndarray] = {}
        self.threads = max(1, threads or default_threads())
        self.scratch = [(np.empty(CHUNK, np.float32), np.empty(CHUNK, np.float32)) for _ in range(self.threads)]

    @property
    def active(self) -> bool:
        return self.settings.name != "none"

    def state_size(self, size: int) -> int:
        """How many values each state array holds for a flat vector of ``size`` values."""
        if self.trainable is None:
            return size
        return sum(stop - start for start, stop in self.trainable)

    def spans(self, size: int) -> list[tuple[int, int]]:
        return [(0, size)] if self.trainable is None else self.trainable

    def step(self, global_weights: np.ndarray, aggregate: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The next global weights from the current ones and the round's aggregate.

        Written into ``out`` when given (``out`` may be ``aggregate`` itself: the step then runs in
        place), else into a new array. ``global_weights`` is only read.
        """
        if out is None:
            out = np.empty_like(aggregate)  # every position is written: stepped, or copied from the aggregate
        self.begin(global_weights.size).apply(0, global_weights, aggregate, out)
        return out

    def begin(self, size: int) -> OuterStep:
        """This round's step over a flat vector of ``size`` values, to take part by part
        (:meth:`OuterStep.apply`); the state counts the round once, however many parts it comes in."""
        if self.trainable is not None and self.trainable and self.trainable[-1][1] > size:
            raise ValueError(f"the trainable spans reach position {self.trainable[-1][1]}, the weights hold "
                             f"{size} values")
        return OuterStep(self, self.start_state(self.state_size(size)) if self.active else None)

    def chunks(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(first, last, state offset)`` of every chunk of the trainable spans within ``[start, stop)``."""
        at = 0
        for span_start, span_stop in self.spans(stop):
            first, last = max(span_start, start), min(span_stop, stop)
            for chunk in range(first, last, CHUNK):
                yield chunk, min(chunk + CHUNK, last), at + chunk - span_start
            at += span_stop - span_start

    def untrained(self, start: int, stop: int) -> Iterator[tuple[int, int]]:
        """The ``(first, last)`` runs within ``[start, stop)`` that the step leaves alone (they take the aggregate)."""
        at = start
        for span_start, span_stop in ([] if not self.active else self.spans(stop)):
            if span_start > at:
                yield at, min(span_start, stop)
            at = max(at, span_stop)
            if at >= stop:
                return
        if at < stop:
            yield at, stop

    def start_state(self, state_size: int) -> Callable[..., None]:
        """The round's kernel over one chunk; the state arrays exist (zeros) when it returns."""
        name = self.settings.name
        if name == "adam":
            fresh = "m" not in self.state
            for key in ("m", "v"):
                if fresh:
                    self.state[key] = np.zeros(state_size, np.float32)
            t = int(self.state.get("iterations", np.zeros(1, np.int64))[0]) + 1
            self.state["iterations"] = np.array([t], dtype=np.int64)
            return self._adam_kernel(t)
        fresh = "velocity" not in self.state
        if fresh:
            self.state["velocity"] = np.empty(state_size, np.float32)
        return self._sgd_kernel(fresh)

    def _sgd_kernel(self, fresh: bool) -> Callable[..., None]:
        s = self.settings
        mu, lr, nesterov = np.float32(s.momentum), np.float32(s.learning_rate), s.name == "nesterov"
        velocity = self.state["velocity"]

        def kernel(weights: np.ndarray, aggregate: np.ndarray, out: np.ndarray, at: int,
                   scratch: tuple[np.ndarray, np.ndarray]) -> None:
            n = weights.size
            delta, step = scratch[0][:n], scratch[1][:n]
            v = velocity[at:at + n]
            np.subtract(weights, aggregate, out=delta)
            if fresh:  # v = delta
                np.copyto(v, delta)
            else:  # v = mu * v + delta
                v *= mu
                v += delta
            if nesterov:  # step = delta + mu * v
                np.multiply(v, mu, out=step)
                step += delta
            else:
                np.copyto(step, v)
            step *= lr  # w = aggregate - (lr * step - delta)
            step -= delta
            np.subtract(aggregate, step, out=out)

        return kernel

    def _adam_kernel(self, t: int) -> Callable[..., None]:
        s = self.settings
        b1, b2, eps = np.float32(s.beta_1), np.float32(s.beta_2), np.float32(s.epsilon)
        # Keras' form: the bias corrections fold into the learning rate
        alpha = np.float32(s.learning_rate * np.sqrt(1 - s.beta_2 ** t) / (1 - s.beta_1 ** t))
        m_all, v_all = self.state["m"], self.state["v"]

        def kernel(weights: np.ndarray, aggregate: np.ndarray, out: np.ndarray, at: int,
                   scratch: tuple[np.ndarray, np.ndarray]) -> None:
            n = weights.size
            delta, work = scratch[0][:n], scratch[1][:n]
            m, v = m_all[at:at + n], v_all[at:at + n]
            np.subtract(weights, aggregate, out=delta)
            m *= b1  # m = b1 * m + (1 - b1) * delta
            np.multiply(delta, 1 - b1, out=work)
            m += work
            v *= b2  # v = b2 * v + (1 - b2) * delta ** 2
            np.square(delta, out=work)
            work *= 1 - b2
            v += work
            np.sqrt(v, out=delta)  # w = w - alpha * m / (sqrt(v) + eps)
            delta += eps
            np.multiply(m, alpha, out=work)
            work /= delta
            np.subtract(weights, work, out=out)

        return kernel

    # -- checkpoints --------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The state as checkpoint arrays, named ``outer_<name>``."""
        return {f"{STATE_PREFIX}{name}": array for name, array in sorted(self.state.items())}

    def load_state(self, arrays: dict[str, np.ndarray], size: int) -> None:
        """Take the ``outer_*`` arrays of a checkpoint (others are ignored) for a flat vector of ``size``
        values; an empty state starts fresh.

        A checkpoint written with another outer optimizer holds other arrays, and one written before
        the step skipped the non-trainable weights holds arrays of the whole vector: neither is this
        optimizer's state, so it starts fresh (and says so) rather than misreading them.
        """
        state = {name[len(STATE_PREFIX):]: np.asarray(array) for name, array in arrays.items()
                 if name.startswith(STATE_PREFIX)}
        self.state = {}
        if not state:
            return
        if set(state) != set(self.expected_names()):
            get_logger().info("the checkpoint's outer optimizer state (%s) is not %s's: it starts fresh",
                              ", ".join(sorted(state)), self.settings.name)
            return
        expected = self.state_size(size)
        for name, array in state.items():
            if name != "iterations" and array.size != expected:
                get_logger().warning("the checkpoint's outer optimizer state `%s` holds %d values, the model's "
                                     "trainable weights %d: the %s state starts fresh", name, array.size,
                                     expected, self.settings.name)
                return
        self.state = {name: (array.copy() if name == "iterations" else np.array(array, dtype=np.float32))
                      for name, array in state.items()}

    def snapshot(self, into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """A copy of the state, for :meth:`restore` after a round that must not count (the step works in
        place). Written into ``into``'s arrays when they have the state's names and shapes (a round's copy
        then allocates nothing)."""
        if into is None or into.keys() != self.state.keys() or any(
                into[name].shape != array.shape for name, array in self.state.items()):
            return {name: array.copy() for name, array in self.state.items()}
        for name, array in self.state.items():
            np.copyto(into[name], array)
        return into

    def restore(self, snapshot: dict[str, np.ndarray]) -> None:
        """The state as :meth:`snapshot` copied it (the snapshot stays the caller's)."""
        self.state = {name: array.copy() for name, array in snapshot.items()}

    def expected_names(self) -> tuple[str, ...]:
        return {"none": (), "momentum": ("velocity",), "nesterov": ("velocity",),
                "adam": ("iterations", "m", "v")}[self.settings.name]

class OuterStep:
    """One round's outer step, taken over the flat vector in parts as the round's aggregate arrives.

    ``kernel``: the round's kernel over one chunk (None: outer optimizer ``none``, the aggregate is the
    next global model).
    """

    def __init__(self, optimizer: OuterOptimizer, kernel: Callable[..., None] | None) -> None:
        self.optimizer, self.kernel = optimizer, kernel

    def apply(self, start: int, weights: np.ndarray, aggregate: np.ndarray, out: np.ndarray,
              threads: int | None = None) -> None:
        """Positions ``[start, start + n)`` of the next global weights into ``out`` (n values), from the same
        positions of the current ``weights`` and of the aggregate. ``out`` may be ``aggregate`` or ``weights``
        itself (the step then updates the global weights in place); each position is read before it is written.
        ``threads``: at most so many (default: the optimizer's)."""
        stop = start + aggregate.size
        if out is not aggregate:
            for first, last in self.optimizer.untrained(start, stop):
                np.copyto(out[first - start:last - start], aggregate[first - start:last - start])
        kernel = self.kernel
        if kernel is None:
            return

        def run(part: list[tuple[int, int, int]], scratch: tuple[np.ndarray, np.ndarray]) -> None:
            for first, last, at in part:
                a, b = first - start, last - start
                kernel(weights[a:b], aggregate[a:b], out[a:b], at, scratch)

        in_parallel(run, list(self.optimizer.chunks(start, stop)), self.optimizer.scratch[:threads])


def merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ``(start, stop)`` spans with adjacent or overlapping ones joined and empty ones dropped."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted((int(a), int(b)) for a, b in spans if b > a):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(stop, merged[-1][1]))
        else:
            merged.append((start, stop))
    return merged
