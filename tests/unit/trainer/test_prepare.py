"""What Keras refuses is refused before training with Keras' reason; what Keras takes is taken as it is."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mpi_trainer.errors import ConfigError
from mpi_trainer.trainer.fit import check_backend
from mpi_trainer.trainer.fit_input import build, prepare


def compiled() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


X, Y = np.random.default_rng(0).normal(size=(40, 4)).astype("float32"), np.arange(40) % 3


def test_class_weight_with_sample_weight_is_refused_with_keras_reason():
    kwargs = {"x": X, "y": Y, "sample_weight": np.ones(40), "class_weight": {0: 1.0, 1: 2.0, 2: 1.0}}
    with pytest.raises(ValueError, match="class_weight.*sample_weight"):
        prepare(compiled(), kwargs, rank=1, workers=2)


def test_validation_split_with_a_dataset_is_refused_with_keras_reason():
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
    with pytest.raises(ValueError, match="validation_split"):
        prepare(compiled(), {"x": dataset, "validation_split": 0.2}, rank=1, workers=2)


def test_an_uncompiled_model_is_refused_as_keras_refuses_it():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match="compile"):
        prepare(model, {"x": X, "y": Y}, rank=0, workers=2)


def test_fewer_rows_than_workers_is_refused_naming_both():
    with pytest.raises(ConfigError, match="3 training rows for 4 workers"):
        prepare(compiled(), {"x": X[:3], "y": Y[:3]}, rank=1, workers=4)


def test_validation_split_takes_the_last_rows_as_keras_does():
    prepared = prepare(compiled(), {"x": X, "y": Y, "validation_split": 0.25, "batch_size": 8}, rank=0, workers=2)
    np.testing.assert_array_equal(prepared.validation["x"], X[30:])
    assert len(prepared.train_data[0]) == 30


def test_a_worker_share_keeps_the_users_values():
    pixels = (np.arange(40 * 4) % 256).astype(np.uint8).reshape(40, 4)
    prepared = prepare(compiled(), {"x": pixels, "y": Y, "batch_size": 8, "shuffle": False}, rank=2, workers=2)
    assert prepared.share["x"].dtype == np.uint8 and prepared.share["x"].tolist() == pixels[20:].tolist()
    assert prepared.rows == 20


def test_an_unbuilt_sequential_is_built_from_the_first_batch():
    model = keras.Sequential([keras.layers.Dense(5), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    kwargs = {"x": X, "y": Y, "batch_size": 8}
    build(model, kwargs, prepare(model, kwargs, rank=0, workers=2))
    assert model.built and model.optimizer.built and model.layers[0].kernel.shape == (4, 5)


def test_a_keras_backend_asked_for_too_late_is_named(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax" if keras.backend.backend() != "jax" else "tensorflow")
    with pytest.raises(ConfigError, match="reads it once"):
        check_backend()


@pytest.mark.parametrize("key, value", [("data.placement", "scatter"), ("train.seed", 7)])
def test_engine_settings_a_keras_model_does_not_use_are_refused_not_ignored(key, value):
    from mpi_trainer.config import load_config
    from mpi_trainer.trainer.fit import check_config

    section, name = key.split(".")
    cfg = load_config({section: {name: value}})
    with pytest.raises(ConfigError, match=f"`{key}`.*Received: {key}="):
        check_config(cfg, None, False)


def test_resume_without_a_run_directory_is_refused_naming_it(monkeypatch):
    from mpi_trainer.config import load_config
    from mpi_trainer.trainer.fit import check_config

    monkeypatch.delenv("MPI_TRAINER_RUN_DIR", raising=False)
    with pytest.raises(ConfigError, match="`resume=True` needs the run directory.*Received: run_dir=None"):
        check_config(load_config({}), None, True)


def test_an_unbuilt_model_with_a_generator_is_refused_before_training():
    model = keras.Sequential([keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    batches = ((X[:8], Y[:8]) for _ in range(3))
    kwargs = {"x": batches}
    with pytest.raises(ConfigError, match="must be built before `fit`.*Received: an unbuilt model and a generator"):
        build(model, kwargs, prepare(model, kwargs, rank=0, workers=2))


def test_an_epoch_in_which_a_worker_trained_nothing_fails_naming_it():
    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
    from mpi_trainer.trainer.round_protocol import Report
    from mpi_trainer.trainer.run_record import FitRecord
    from mpi_trainer.trainer.scheduler import RoundCombine, SchedulerRounds
    from mpi_trainer.trainer.state import ModelState

    model = compiled()
    model.optimizer.build(model.trainable_variables)
    state, outer = ModelState(model), OuterOptimizer(OuterSettings("nesterov"))
    rounds = SchedulerRounds(None, model, state, outer, None, None, 1, FitRecord(None, {}, {}))
    trained, empty = Report({"loss": 1.0}, 3, 24, 0.1, []), Report({}, 0, 0, 0.1, [])
    rounds.outer_saved = outer.snapshot()  # as a round saves it before the sum
    combining = RoundCombine(state, outer, rounds.buffer[:state.size], rounds.before, 1.0, np.array([3.0, 3.0]))
    combining.part(0, state.size)
    with pytest.raises(RuntimeError, match=r"worker rank\(s\) \[2\] trained no batch in epoch 4"):
        rounds.combine(4, [trained, empty], combining)
    assert outer.state == {}  # the round that is not kept leaves the outer optimizer as it was


def check(overrides, **kwargs):
    """``check_input`` of the settings ``overrides`` against fit's arguments ``kwargs``."""
    from mpi_trainer.config import load_config
    from mpi_trainer.trainer.fit_input import check_input

    check_input(load_config({}, overrides), kwargs)


def test_a_sync_warm_up_of_a_pipeline_is_refused_naming_the_warm_up():
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((8, 2)))
    with pytest.raises(ConfigError, match=r"Received: train.sync_warmup_every=2 with x of kind 'tf.data.Dataset'.*"
                                          r"or train.sync_warmup_epochs=0"):
        check(["train.sync_warmup_epochs=1", "train.sync_warmup_every=2"], x=dataset)


def test_sync_every_takes_arrays_and_names_what_it_cannot_cut_into_rounds():
    arrays = {"x": np.zeros((8, 2), "float32"), "y": np.zeros(8)}
    check(["train.sync_every=4"], **arrays)
    check([], x=tf.data.Dataset.from_tensor_slices(np.zeros((8, 2))))
    with pytest.raises(ConfigError, match=r"train.sync_every=4 with x of kind 'tf.data.Dataset'"):
        check(["train.sync_every=4"], x=tf.data.Dataset.from_tensor_slices(np.zeros((8, 2))))
    with pytest.raises(ConfigError, match=r"steps_per_epoch=2"):
        check(["train.sync_every=4"], **arrays, steps_per_epoch=2)


def test_best_of_without_validation_data_is_refused_naming_what_it_needs():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    with pytest.raises(ConfigError, match="aggregation.method='best' with validation_data=None"):
        prepare(model, {"x": X, "y": Y}, rank=1, workers=2, elects=True)


def test_under_best_of_every_worker_holds_the_whole_validation_data():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    kwargs = {"x": X, "y": Y, "validation_split": 0.25}
    rows = [prepare(model, kwargs, rank, 2, workers_score=True, elects=True) for rank in (0, 1, 2)]
    assert not any(part.workers_score for part in rows)
    assert rows[0].election is None
    for part in rows[1:]:
        assert part.election is not None and len(part.election["x"]) == len(rows[0].validation["x"])
