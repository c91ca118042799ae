"""What travels from the scheduler to every worker to rebuild the same model: :class:`ModelSpec`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelSpec:
    architecture: str
    optimizer: dict[str, Any] | None  # None under L-BFGS
    loss: Any  # a Keras loss identifier, one of :mod:`.losses`' names, or a serialised loss
    user_module: str | None
    metrics: list[Any] = field(default_factory=lambda: ["accuracy"])  # identifiers or serialised metrics
    user_compiled: bool = False  # the model function compiled the model: its own optimizer, loss and metrics
    # A multi-output model's own compile config (losses, loss weights and metrics per output), as
    # ``keras.Model.get_compile_config`` gives it; None: compiled from the fields above.
    compile_config: dict[str, Any] | None = None
