"""Dict inputs of a multi-input model packed into one matrix, and the wrapper that unpacks them."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.models.packed import Column, pack, packed_model


def two_input_model():
    a, b = keras.Input((3,), name="a"), keras.Input((2, 2), name="b")
    joined = keras.layers.concatenate([a, keras.layers.Flatten()(b)])
    model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(joined))
    model.compile("sgd", "mse")
    return model


def test_inputs_are_packed_in_sorted_order_and_the_wrapper_predicts_as_the_model():
    xa, xb = np.arange(15.0).reshape(5, 3), np.arange(20.0).reshape(5, 2, 2)
    packed, columns = pack({"b": xb, "a": xa})
    assert columns == [Column("a", 0, 3, (3,)), Column("b", 3, 7, (2, 2))]
    model = two_input_model()
    wrapper = keras.models.model_from_json(packed_model(model, columns).to_json())  # as a worker rebuilds it
    wrapper.set_weights(model.get_weights())
    expected = model.predict({"a": xa, "b": xb}, verbose=0)
    assert np.allclose(wrapper.predict(packed, verbose=0), expected)


def test_packing_refuses_strings_ragged_rows_and_names_the_model_lacks():
    with pytest.raises(ConfigError, match=r"`x\['s'\]` must be numeric"):
        pack({"s": np.array(["a", "b"])})
    with pytest.raises(ConfigError, match="same number of rows"):
        pack({"a": np.zeros(3), "b": np.zeros(4)})
    _, columns = pack({"a": np.zeros((2, 3)), "c": np.zeros((2, 4))})
    with pytest.raises(ConfigError, match=r"Received: x keys \['a', 'c'\]; expected the model's inputs \['a', 'b'\]"):
        packed_model(two_input_model(), columns)


def test_the_files_a_dict_input_model_writes_on_rank_0_hold_the_users_model(tmp_path):
    # what ModelCheckpoint, the run's final weights and a callback's model.save write
    xa, xb = np.arange(15.0).reshape(5, 3), np.arange(20.0).reshape(5, 2, 2)
    packed, columns = pack({"a": xa, "b": xb})
    model = two_input_model()
    wrapper = keras.models.model_from_json(packed_model(model, columns).to_json())  # as a worker rebuilds it
    wrapper.set_weights([w + 1.0 for w in model.get_weights()])
    wrapper.save_weights(tmp_path / "w.weights.h5")
    wrapper.save(tmp_path / "m.keras")
    fresh = two_input_model()
    fresh.load_weights(tmp_path / "w.weights.h5")
    for ours, theirs in zip(fresh.get_weights(), wrapper.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    reloaded = keras.models.load_model(tmp_path / "m.keras")  # the user's model: it takes the dict inputs
    assert reloaded.name == model.name
    np.testing.assert_allclose(reloaded.predict({"a": xa, "b": xb}, verbose=0), wrapper.predict(packed, verbose=0),
                               rtol=1e-6)
