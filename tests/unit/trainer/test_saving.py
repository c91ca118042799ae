"""After fit, every rank's model.save writes whole files: by a rename, never in place."""

from __future__ import annotations

import os
import threading

import keras
import numpy as np

from mpi_trainer.trainer.saving import save_whole_files


def small_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("adam", "mse")
    return model


def test_many_savers_of_one_path_leave_a_whole_file_every_reader_can_load(tmp_path):
    models = [small_model() for _ in range(4)]
    for model in models:
        model.set_weights(models[0].get_weights())  # every rank holds the same weights after fit
        save_whole_files(model)
    path = tmp_path / "model.keras"
    errors = []

    def save_then_load(model):
        try:
            for _ in range(3):
                model.save(path)
                loaded = keras.models.load_model(path)
                np.testing.assert_array_equal(loaded.get_weights()[0], models[0].get_weights()[0])
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=save_then_load, args=(model,)) for model in models]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]  # no temporary file left behind


def test_save_weights_keeps_keras_extension_rules_and_a_failed_save_leaves_nothing(tmp_path):
    model = small_model()
    save_whole_files(model)
    model.save_weights(tmp_path / "w.weights.h5")
    other = small_model()
    other.load_weights(tmp_path / "w.weights.h5")
    np.testing.assert_array_equal(other.get_weights()[0], model.get_weights()[0])
    try:
        model.save_weights(tmp_path / "w.h5")  # Keras refuses a name without .weights.h5
    except ValueError as exc:
        assert "weights.h5" in str(exc)
    assert sorted(os.listdir(tmp_path)) == ["w.weights.h5"]


def test_wrapping_twice_is_harmless():
    model = small_model()
    save_whole_files(model)
    first = model.save
    save_whole_files(model)
    assert model.save is first


def test_a_model_inside_the_fitted_one_saves_whole_files_too(tmp_path):
    base = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)], name="base")
    outer = keras.Sequential([base, keras.layers.Dense(2)])
    outer.compile("adam", "mse")
    save_whole_files(outer)
    assert getattr(base.save, "whole_file", False)
    base.save(tmp_path / "base.keras")
    assert sorted(os.listdir(tmp_path)) == ["base.keras"]
