"""A wrapper model around the user's model that writes files of the user's model.

mpi_trainer trains some models behind a wrapper: dict inputs packed into one matrix (:mod:`.packed`),
targets per output packed into one matrix (:mod:`.packed_targets`). A wrapper adds no weights, so its
weights are the user's model's, in the same order. :class:`NestedModel` makes the files written on
rank 0 (``ModelCheckpoint``, the run's final weights, a callback's ``model.save``) hold the user's model
as it was built, so that they load into it; it travels to the workers as its own config and the one
it wraps.
"""

from __future__ import annotations

from typing import Any

import keras


class Unpacking(keras.layers.Layer):
    """A weightless layer that cuts a wrapper's packed input back apart (:class:`.packed.InputColumns`):
    a model built on such layers around one nested model is a wrapper, and that model is the user's."""


@keras.saving.register_keras_serializable(package="mpi_trainer")
class NestedModel(keras.Model):
    """``inner``'s inputs, outputs and weights; files hold the user's model (:meth:`users_model`)."""

    def __init__(self, inner: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inner = inner
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

    def save(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        return self.users_model().save(filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath: Any, overwrite: bool = True, **kwargs: Any) -> Any:
        return self.users_model().save_weights(filepath, overwrite=overwrite, **kwargs)

    def load_weights(self, filepath: Any, **kwargs: Any) -> Any:
        return self.users_model().load_weights(filepath, **kwargs)

    def users_model(self) -> Any:
        """The wrapped model, or behind packed inputs (:mod:`.packed`) the one model nested in that wrapper."""
        nested = [layer for layer in self.inner.layers if isinstance(layer, keras.Model)]
        packed = any(isinstance(layer, Unpacking) for layer in self.inner.layers)
        return nested[0] if packed and len(nested) == 1 else self.inner

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "inner": keras.saving.serialize_keras_object(self.inner)}

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> NestedModel:
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("inner"), custom_objects=custom_objects)
        return cls(inner, **config)
