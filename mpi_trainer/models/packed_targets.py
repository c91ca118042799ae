"""A multi-output model trained on packed targets (:mod:`mpi_trainer.data.targets`), scored per output.

The job moves one target matrix; Keras wants one target per output. :class:`PackedTargets` wraps the
user's model (or its packed-input wrapper, :mod:`.packed`) and cuts each output's columns back out,
to the output's shape and dtype, in ``compute_loss`` and ``compute_metrics``, the two places where
Keras' ``fit``, ``train_on_batch``, ``evaluate`` and ``test_on_batch`` meet the targets, on every
backend. It is compiled with the user's own compile config and carries the user's output names, so
the losses and metrics are Keras' own, named as plain ``model.fit`` names them (``loss``,
``<output>_loss``, ``<output>_<metric>``). Its weights are the wrapped model's, in the same order.
"""

from __future__ import annotations

from typing import Any

import keras

from mpi_trainer.data.targets import TargetColumn, output_names
from mpi_trainer.errors import ConfigError
from mpi_trainer.models.nested import NestedModel


@keras.saving.register_keras_serializable(package="mpi_trainer")
class PackedTargets(NestedModel):
    """``inner``'s outputs, trained and scored against the packed target matrix's ``columns``."""

    def __init__(self, inner: Any, columns: list[TargetColumn], output_names: list[str], **kwargs: Any) -> None:
        super().__init__(inner, **kwargs)
        self.target_columns = [c if isinstance(c, TargetColumn) else TargetColumn.from_config(c) for c in columns]
        self.output_names = [str(name) for name in output_names]  # Keras names losses and metrics after them

    def unpack(self, y: Any) -> Any:
        """The packed targets of a batch as ``{output name: targets}``, each of its shape and dtype."""
        if y is None:
            return None
        return {c.name: keras.ops.cast(keras.ops.reshape(y[:, c.start:c.end], (-1, *c.shape)), device_dtype(c.dtype))
                for c in self.target_columns}

    def compute_loss(self, x: Any = None, y: Any = None, y_pred: Any = None, sample_weight: Any = None,
                     training: bool = True) -> Any:
        return super().compute_loss(x, self.unpack(y), y_pred, sample_weight, training=training)

    def compute_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        return super().compute_metrics(x, self.unpack(y), y_pred, sample_weight)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "columns": [c.to_config() for c in self.target_columns],
                "output_names": list(self.output_names)}


def device_dtype(dtype: str) -> str:
    """The dtype a backend holds targets of ``dtype`` in: JAX (without x64) has no 64-bit types, and Keras'
    own input pipeline hands it 32-bit ones; the other backends keep the dtype."""
    if keras.backend.backend() != "jax":
        return dtype
    import jax

    x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]  # a flag jax declares at run time
    return dtype if x64 else {"int64": "int32", "uint64": "uint32", "float64": "float32"}.get(dtype, dtype)


def targets_source(model: Any, input_layout: list[Any] | None,
                   columns: list[TargetColumn]) -> tuple[Any, list[tuple[str, Any]]]:
    """:func:`mpi_trainer.fit` with ``y`` per output: the function ``(input_shape, num_outputs) -> model``
    that builds the job's model, ``model`` (behind its packed inputs when ``x`` was a dict) wrapped for
    packed targets, and the config override naming it."""
    from mpi_trainer.models.packed import packed_functional

    names = output_names(model)
    if names is None:
        raise TypeError(f"Targets per output need a built keras.Model. Received: model of type {type(model).__name__}")
    compile_config = model.get_compile_config() if getattr(model, "optimizer", None) is not None else {}
    if not compile_config.get("loss"):
        raise ConfigError(f"A multi-output model must be compiled (with a loss for its outputs) before `fit`, "
                          f"as for model.fit. Received: model {model.name!r}, not compiled, with outputs {names}; "
                          f"expected model.compile(optimizer, loss={{name: loss for each output}}) first")

    def build(input_shape: tuple[int, ...], num_outputs: int) -> Any:
        inner = model if input_layout is None else packed_functional(model, input_layout)
        wrapper = PackedTargets(inner, columns, names, name=f"{model.name}_targets")
        wrapper.compile_from_config(compile_config)
        return wrapper

    return build, [("model.name", model.name)]
