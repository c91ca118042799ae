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


@keras.saving.register_keras_serializable(package="mpi_trainer")
class PackedTargets(keras.Model):
    """``inner``'s outputs, trained and scored against the packed target matrix's ``columns``."""

    def __init__(self, inner: Any, columns: list[Any], output_names: list[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = inner
        self.target_columns = [c if isinstance(c, TargetColumn) else TargetColumn.from_config(c) for c in columns]
        self.output_names = [str(name) for name in output_names]  # Keras names losses and metrics after them
        self.built = inner.built

    @property
    def inputs(self) -> Any:
        return self.inner.inputs

    @property
    def outputs(self) -> Any:
        return self.inner.outputs

    @property
    def input_shape(self) -> Any:
        return self.inner.input_shape

    def call(self, inputs: Any, training: bool = False) -> Any:
        return self.inner(inputs, training=training)

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

    # Files hold the user's model as it was built: what ModelCheckpoint, the run's final weights and a
    # callback's model.save write reloads into the user's model (the wrappers add no weights).
    def save(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        return self.users_model().save(filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        return self.users_model().save_weights(filepath, overwrite=overwrite, **kwargs)

    def load_weights(self, filepath: Any, **kwargs: Any) -> Any:
        return self.users_model().load_weights(filepath, **kwargs)

    def users_model(self) -> Any:
        """The wrapped model, or behind packed inputs (:mod:`.packed`) the one model nested in that wrapper."""
        from mpi_trainer.models.packed import InputColumns

        nested = [layer for layer in self.inner.layers if isinstance(layer, keras.Model)]
        packed = any(isinstance(layer, InputColumns) for layer in self.inner.layers)
        return nested[0] if packed and len(nested) == 1 else self.inner

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "inner": keras.saving.serialize_keras_object(self.inner),
                "columns": [c.to_config() for c in self.target_columns], "output_names": list(self.output_names)}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> PackedTargets:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner"), custom_objects=custom_objects)
        return cls(inner, **config)


def device_dtype(dtype: str) -> str:
    """The dtype a backend holds targets of ``dtype`` in: JAX (without x64) has no 64-bit types, and Keras'
    own input pipeline hands it 32-bit ones; the other backends keep the dtype."""
    if keras.backend.backend() != "jax":
        return dtype
    import jax

    return dtype if jax.config.jax_enable_x64 else {"int64": "int32", "uint64": "uint32", "float64": "float32"}.get(
        dtype, dtype)


def targets_source(model: Any, input_layout: list[Any] | None,
                   columns: list[TargetColumn]) -> tuple[Any, list[tuple[str, Any]]]:
    """:func:`mpi_trainer.fit` with ``y`` per output: the function ``(input_shape, num_outputs) -> model``
    that builds the job's model, ``model`` (behind its packed inputs when ``x`` was a dict) wrapped for
    packed targets, and the config override naming it."""
    from mpi_trainer.models.packed import packed_model

    names = output_names(model)
    compile_config = model.get_compile_config() if getattr(model, "optimizer", None) is not None else {}
    if not compile_config.get("loss"):
        raise ConfigError(f"A multi-output model must be compiled (with a loss for its outputs) before `fit`, "
                          f"as for model.fit. Received: model {model.name!r}, not compiled, with outputs {names}; "
                          f"expected model.compile(optimizer, loss={{name: loss for each output}}) first")

    def build(input_shape: tuple[int, ...], num_outputs: int) -> Any:
        inner = model if input_layout is None else packed_model(model, input_layout)
        wrapper = PackedTargets(inner, columns, names, name=f"{model.name}_targets")
        wrapper.compile_from_config(compile_config)
        return wrapper

    return build, [("model.name", model.name)]
