"""A Keras model's training state, laid out for a round: what moves, and how each part is combined.

A round moves everything training changes, and combines each part as its meaning requires:

* **trainable weights** (``model.trainable_weights``): averaged over the workers, then stepped
  by the outer optimizer. They lead the flat buffer, so the outer step works on one prefix;
* **other floating-point weights** (``BatchNormalization``'s moving mean and variance, an adapted
  ``Normalization``'s statistics): averaged plainly, never stepped;
* **the optimizers' floating-point variables** (moments, a ``LossScaleOptimizer``'s scale):
  averaged plainly. The learning rate is the scheduler's (its callbacks may set it), not averaged;
* **integer state** (the optimizers' step counts, integer weights): not averaged; the first
  worker's values are taken, so ``model.optimizer.iterations`` counts the steps a worker took.

Random seeds and metric state are not moved: each rank keeps its own. Layer state that is not a
variable (an adapted ``TextVectorization``'s vocabulary) is already the same on every rank, since
every rank ran the script that adapted it.

The optimizers are ``model.optimizer`` and any other optimizer the model holds as an attribute
(a GAN's ``d_optimizer`` and ``g_optimizer``), in the order of their attribute names.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def model_optimizers(model: Any) -> list[Any]:
    """The optimizers a model trains with: ``model.optimizer`` first, then optimizer attributes by name."""
    import keras

    found: list[Any] = []
    candidates = [getattr(model, "optimizer", None)]
    candidates += [value for _, value in sorted(vars(model).items()) if isinstance(value, keras.optimizers.Optimizer)]
    for optimizer in candidates:
        if optimizer is not None and all(optimizer is not seen for seen in found):
            found.append(optimizer)
    return found


def build_optimizers(model: Any) -> None:
    """Build every optimizer for the model's trainable variables, as its first training step would."""
    for optimizer in model_optimizers(model):
        if not optimizer.built:
            optimizer.build(model.trainable_variables)


def _is_float(variable: Any) -> bool:
    import keras

    return "float" in keras.backend.standardize_dtype(variable.dtype)


def _value(variable: Any) -> np.ndarray:
    import keras

    return np.asarray(keras.ops.convert_to_numpy(variable.value))


class ModelState:
    """The model's state as one flat float32 vector (trainable first) plus a list of integer arrays."""

    def __init__(self, model: Any) -> None:
        optimizers = model_optimizers(model)
        weights = list(model.weights)
        trainable_ids = {id(v) for v in model.trainable_weights}
        trainable = [v for v in weights if id(v) in trainable_ids and _is_float(v)]
        other = [v for v in weights if id(v) not in trainable_ids and _is_float(v)]
        optimizer_vars = [v for opt in optimizers for v in opt.variables]
        self.rates = [id(v) for opt in optimizers for v in _rate_variables(opt)]
        self.floats = trainable + other + [v for v in optimizer_vars if _is_float(v)]
        self.integers = [v for v in weights + optimizer_vars if not _is_float(v)]
        self.sizes = [int(np.prod(v.shape)) for v in self.floats]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        self.trainable_size = int(sum(self.sizes[:len(trainable)]))
        self._rate_spans = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i, v in enumerate(self.floats)
                            if id(v) in self.rates]

    def empty(self) -> np.ndarray:
        return np.zeros(self.size, dtype=np.float32)

    def read(self, out: np.ndarray) -> np.ndarray:
        """The model's floating-point state, written into ``out``."""
        for variable, start, end in zip(self.floats, self.offsets[:-1], self.offsets[1:]):
            out[start:end] = _value(variable).reshape(-1)
        return out

    def write(self, flat: np.ndarray) -> None:
        """Assign the floating-point state from ``flat``."""
        for variable, start, end in zip(self.floats, self.offsets[:-1], self.offsets[1:]):
            variable.assign(flat[start:end].reshape(variable.shape).astype(variable.dtype))

    def read_integers(self) -> list[np.ndarray]:
        return [_value(v) for v in self.integers]

    def write_integers(self, values: list[np.ndarray]) -> None:
        for variable, value in zip(self.integers, values):
            variable.assign(np.asarray(value, dtype=variable.dtype).reshape(variable.shape))

    def keep_rates(self, combined: np.ndarray, own: np.ndarray) -> None:
        """The learning rates in ``combined`` are put back to ``own``'s (the scheduler's)."""
        for start, end in self._rate_spans:
            combined[start:end] = own[start:end]

    def describe(self) -> str:
        mib = self.size * 4 / 2**20
        return (f"{len(self.floats)} floating-point variables ({self.size:,} values, {mib:.2f} MiB, "
                f"{self.trainable_size:,} trainable), {len(self.integers)} integer variables")


def _rate_variables(optimizer: Any) -> list[Any]:
    """The variables holding an optimizer's learning rate (none when it is a schedule)."""
    found = []
    for holder in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        rate = getattr(holder, "_learning_rate", None)
        if rate is not None and hasattr(rate, "assign"):
            found.append(rate)
    return found
