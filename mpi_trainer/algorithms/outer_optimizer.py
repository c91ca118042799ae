"""Outer optimizers: the step the scheduler takes from the round's aggregate to the next global model.

Plain model averaging makes the aggregate the next global model. An outer
optimizer treats the round's change as a gradient instead: the
pseudo-gradient ``delta = w_global - aggregate`` (the step the workers took,
averaged, pointing uphill like a gradient) goes into SGD with momentum
(SlowMo), Nesterov momentum (DiLoCo) or Adam (FedAdam), and that optimizer
moves ``w_global``. Everything here is pure NumPy over flat float32 vectors;
the state is a dict of named arrays, so a checkpoint stores it as it is.

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

from dataclasses import dataclass

import numpy as np

from mpi_trainer.config.schema import OUTER_OPTIMIZERS, Config

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
        return cls(cfg.outer_optimizer_for(workers), section.outer_learning_rate, section.outer_momentum,
                   section.outer_beta_1, section.outer_beta_2, section.outer_epsilon)

    def describe(self) -> str:
        if self.name == "none":
            return "outer optimizer none (the aggregate is the next global model)"
        extra = (f"beta_1 {self.beta_1:g}, beta_2 {self.beta_2:g}, epsilon {self.epsilon:g}" if self.name == "adam"
                 else f"momentum {self.momentum:g}")
        return f"outer optimizer {self.name} (learning rate {self.learning_rate:g}, {extra})"


class OuterOptimizer:
    """Moves the global weights from each round's aggregate; holds its state between rounds."""

    def __init__(self, settings: OuterSettings) -> None:
        named = [name for name in OUTER_OPTIMIZERS if name != "auto"]  # "auto" is resolved by the config
        if settings.name not in named:
            raise ValueError(f"outer optimizer must be one of {named}. Received: name={settings.name!r}")
        self.settings = settings
        self.state: dict[str, np.ndarray] = {}

    @property
    def active(self) -> bool:
        return self.settings.name != "none"

    def step(self, global_weights: np.ndarray, aggregate: np.ndarray) -> np.ndarray:
        """The next global weights from the current ones and the round's aggregate (a new array)."""
        if not self.active:
            return aggregate
        delta = np.subtract(global_weights, aggregate, dtype=np.float32)
        if self.settings.name == "adam":
            return self._adam(global_weights, delta)
        return self._sgd(aggregate, delta)

    def _sgd(self, aggregate: np.ndarray, delta: np.ndarray) -> np.ndarray:
        s = self.settings
        mu, lr = np.float32(s.momentum), np.float32(s.learning_rate)
        velocity = self.state.get("velocity")
        velocity = delta.copy() if velocity is None else mu * velocity + delta
        self.state["velocity"] = velocity
        step = delta + mu * velocity if s.name == "nesterov" else velocity
        return aggregate - (lr * step - delta)

    def _adam(self, global_weights: np.ndarray, delta: np.ndarray) -> np.ndarray:
        s = self.settings
        b1, b2 = np.float32(s.beta_1), np.float32(s.beta_2)
        t = int(self.state.get("iterations", np.zeros(1, np.int64))[0]) + 1
        m = self.state.get("m", np.zeros_like(delta))
        v = self.state.get("v", np.zeros_like(delta))
        m = b1 * m + (1 - b1) * delta
        v = b2 * v + (1 - b2) * np.square(delta)
        self.state.update(m=m, v=v, iterations=np.array([t], dtype=np.int64))
        # Keras' form: the bias corrections fold into the learning rate
        alpha = np.float32(s.learning_rate * np.sqrt(1 - s.beta_2 ** t) / (1 - s.beta_1 ** t))
        return global_weights - alpha * m / (np.sqrt(v) + np.float32(s.epsilon))

    # -- checkpoints --------------------------------------------------------------
    def state_arrays(self) -> dict[str, np.ndarray]:
        """The state as checkpoint arrays, named ``outer_<name>``."""
        return {f"{STATE_PREFIX}{name}": array for name, array in sorted(self.state.items())}

    def load_state(self, arrays: dict[str, np.ndarray], size: int) -> None:
        """Take the ``outer_*`` arrays of a checkpoint (others are ignored); an empty state starts fresh.

        A checkpoint written with another outer optimizer holds other arrays: they are not this
        optimizer's state, so it starts fresh rather than misreading them.
        """
        state = {name[len(STATE_PREFIX):]: np.asarray(array) for name, array in arrays.items()
                 if name.startswith(STATE_PREFIX)}
        if set(state) != set(self.expected_names()):
            self.state = {}
            return
        for name, array in state.items():
            if name != "iterations" and array.size != size:
                raise ValueError(f"the checkpoint's outer optimizer state `{name}` holds {array.size} values, "
                                 f"the model has {size}")
        self.state = {name: (array if name == "iterations" else array.astype(np.float32))
                      for name, array in state.items()}

    def expected_names(self) -> tuple[str, ...]:
        return {"none": (), "momentum": ("velocity",), "nesterov": ("velocity",),
                "adam": ("iterations", "m", "v")}[self.settings.name]

    def reset(self) -> None:
        self.state = {}
