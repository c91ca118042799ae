"""Workers' optimizer state (step counter, moments) as flat vectors for checkpoints.

Each worker keeps its own optimizer between rounds. A checkpoint stores one
vector per worker rank; a resume hands them back. When the worker count
changed, new worker ``w`` takes the state of old worker ``((w - 1) mod old) + 1``
so every worker starts warm. The learning rate is not part of the vector: the
scheduler owns it (NaN rollbacks halve it).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

ARRAY_PREFIX = "optimizer_rank_"
T = TypeVar("T")  # a state as held: in memory, or left on disk in a checkpoint


def _state_variables(optimizer: Any) -> list[Any]:
    return [v for v in optimizer.variables if "learning_rate" not in v.path]


def ensure_built(model: Any) -> None:
    """Create the optimizer's variables now, so their layout is fixed before the first round."""
    if not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)


def state_size(optimizer: Any) -> int:
    """Values in the optimizer's state vector."""
    return sum(int(np.prod(v.shape)) for v in _state_variables(optimizer))


def state_parts(optimizer: Any) -> Iterator[np.ndarray]:
    """The state vector's parts in order, one variable's float32 host copy at a time: sent as they come,
    the whole vector never exists on the worker."""
    for variable in _state_variables(optimizer):
        yield np.ravel(np.asarray(variable.numpy(), dtype=np.float32))


def state_vector(optimizer: Any) -> np.ndarray:
    """The optimizer's state in one float32 vector, filled variable by variable (no second copy of it)."""
    vector = np.empty(state_size(optimizer), dtype=np.float32)
    offset = 0
    for part in state_parts(optimizer):
        vector[offset:offset + part.size] = part
        offset += part.size
        del part  # copied in: freed before the next variable's copy is made
    return vector


def load_state_vector(optimizer: Any, flat: np.ndarray) -> None:
    variables = _state_variables(optimizer)
    expected = sum(int(np.prod(v.shape)) for v in variables)
    if flat.size != expected:
        raise ValueError(f"optimizer state has {flat.size} values, this optimizer needs {expected}")
    offset = 0
    for variable in variables:
        size = int(np.prod(variable.shape))
        variable.assign(flat[offset:offset + size].reshape(variable.shape).astype(variable.dtype))
        offset += size


def assign_states(saved: Mapping[int, T], workers: Sequence[int]) -> dict[int, T]:
    """Saved per-rank states mapped onto the current worker ranks (elastic restarts included)."""
    old = sorted(saved)
    if not old:
        return {}
    return {worker: saved[old[(worker - 1) % len(old)]] for worker in workers}


def split_arrays(arrays: Mapping[str, T]) -> dict[int, T]:
    """The per-rank optimizer vectors among a checkpoint's arrays."""
    return {int(name[len(ARRAY_PREFIX):]): array for name, array in arrays.items()
            if name.startswith(ARRAY_PREFIX)}
