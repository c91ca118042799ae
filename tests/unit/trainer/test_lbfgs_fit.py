"""Full-batch L-BFGS (``model.optimizer = "lbfgs"``) on the Keras fit: the iterates are SciPy's on the whole
training split however the rows are shared, each is an epoch of the History and a row of rounds.csv, and the
run directory resumes and finishes as every fit's does. A scheduler and two workers as threads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from lbfgs_reference import scipy_losses, softmax_regression_objective

from mpi_trainer.config import load_config
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.models import build_model
from mpi_trainer.persistence.run_files import read_rounds
from mpi_trainer.trainer.state import ModelState
from tests.unit.trainer.test_config_fit import start_in_place, train_everywhere  # noqa: F401 - a fixture

LBFGS = {"data": {"source": "digits", "test_size": 0.2},
         "model": {"name": "softmax_regression", "optimizer": "lbfgs"},
         "train": {"epochs": 4, "seed": 0}, "checkpoint": {"every": 2}, "log": {"plots": False}}


def fit_everywhere(run_dir: Path, overrides: list[str] = (), **arguments: Any) -> dict[int, dict[str, Any]]:
    return train_everywhere(run_dir, overrides, LBFGS, **arguments)


@pytest.fixture(scope="module")
def reference() -> list[float]:
    cfg = load_config(LBFGS)
    dataset = load_dataset(cfg.data, cfg.train.seed)
    keras.utils.set_random_seed(cfg.train.seed)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_outputs)
    objective = softmax_regression_objective(dataset.x_train, dataset.y_train, dataset.num_outputs)
    return scipy_losses(objective, ModelState(model).read_trainable(), 6)


def test_the_iterates_are_scipys_on_the_whole_split_and_every_rank_ends_with_them(tmp_path, reference):
    result = fit_everywhere(tmp_path / "run")
    history = result[0]["history"]
    assert result[0]["epoch"] == [0, 1, 2, 3]
    np.testing.assert_allclose(history["loss"], reference[:4], rtol=1e-5)
    for rank in (1, 2):
        assert result[rank]["history"] == history
        for mine, theirs in zip(result[rank]["weights"], result[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    rows = read_rounds(tmp_path / "run" / "rounds.csv")
    evaluations = [int(float(row["function_evaluations"])) for row in rows]
    assert evaluations == sorted(evaluations) and evaluations[-1] >= 5  # the first point, then one or more each
    assert all(float(row["bytes"]) > 0 and float(row["gradient_norm"]) > 0 for row in rows)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stop_reason"] == "epochs" and summary["function_evaluations"] == evaluations[-1]
    assert summary["final_test_accuracy"] > 0.75  # 4 iterations from a random start
    # each evaluation: the parameters (float64) to both workers, and both workers' sums back
    parameters = ModelState(build_model(load_config(LBFGS).model, (8, 8, 1), 10)).trainable_size
    assert int(float(rows[0]["bytes"])) >= evaluations[0] * 2 * 2 * 8 * parameters


def test_a_run_asked_for_more_iterations_goes_on_and_a_complete_one_trains_nothing(tmp_path, reference):
    first = fit_everywhere(tmp_path / "run", ["train.epochs=2"])
    more = fit_everywhere(tmp_path / "run", ["train.epochs=4"])
    assert more[0]["epoch"] == [0, 1, 2, 3]
    assert more[0]["history"]["loss"][:2] == first[0]["history"]["loss"]
    assert more[0]["history"]["loss"][3] < more[0]["history"]["loss"][1]  # a fresh curvature history still descends
    evaluations = [int(float(row["function_evaluations"])) for row in read_rounds(tmp_path / "run" / "rounds.csv")]
    assert evaluations == sorted(evaluations)  # counted on from the first job's
    again = fit_everywhere(tmp_path / "run", ["train.epochs=4"])
    assert again[2]["history"] == more[0]["history"]
    np.testing.assert_array_equal(again[1]["weights"][0], more[0]["weights"][0])


def test_early_stopping_s_restored_iterate_is_the_one_every_rank_ends_with_and_the_summary_names(tmp_path):
    """L-BFGS runs the fit loop every way of training shares: an EarlyStopping that restores its best weights
    at the end of training leaves that iterate on every rank, and summary.json's final figures are its."""
    # the loss only falls, so "max" keeps the first iterate best: it stops after the second, restoring the first
    stop = keras.callbacks.EarlyStopping(monitor="loss", mode="max", patience=1, restore_best_weights=True)
    result = fit_everywhere(tmp_path / "run", callbacks=[stop])
    assert result[0]["epoch"] == [0, 1]
    summary = result[0]["summary"]
    assert summary["final_round"] == 1 and summary["kept_round"] == 0
    assert summary["final_train_loss"] == pytest.approx(result[0]["history"]["loss"][0])
    for rank in (1, 2):
        for mine, theirs in zip(result[rank]["weights"], result[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    fresh = fit_everywhere(tmp_path / "one", ["train.epochs=1"])  # the first iterate, as a fit of one epoch
    for mine, first in zip(result[0]["weights"], fresh[0]["weights"], strict=True):
        np.testing.assert_allclose(mine, first, rtol=1e-6)


def test_weights_the_objective_cannot_take_are_refused_on_every_rank(tmp_path):
    from mpi_trainer.errors import InputError

    with pytest.raises(InputError, match=r"minimises the mean loss over every training row, unweighted"):
        fit_everywhere(tmp_path / "run", class_weight={0: 2.0})


def test_a_zoo_model_given_arrays_trains_by_lbfgs_with_the_same_result_on_every_rank(tmp_path):
    from mpi_trainer.comm.local import LocalWorld
    from mpi_trainer.trainer.config_fit import fit_built

    table = {"model": {"name": "softmax_regression", "optimizer": "lbfgs"}, "train": {"seed": 0}}
    cfg = load_config({"data": {"source": "digits"}, **table})
    data = load_dataset(cfg.data, cfg.train.seed)
    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> dict[str, Any]:
        arrays = (data.x_train, data.y_train, None, (data.x_test, data.y_test)) if index == 0 else (None,) * 4
        history = fit_built(transports[index], load_config(table), table, [], str(tmp_path / "run"), False, None,
                            arrays, {"epochs": 3, "verbose": 0})
        return {"history": history.history, "weights": history.model.get_weights()}

    result = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=240)
    history = result[0]["history"]
    assert len(history["loss"]) == 3 and history["loss"][2] < history["loss"][0]
    assert history["val_accuracy"][-1] > 0.6
    for index in (1, 2):  # the workers were sent rank 0's arrays, and end with its iterate
        assert result[index]["history"] == history
        np.testing.assert_array_equal(result[index]["weights"][0], result[0]["weights"][0])


def test_rows_not_held_as_arrays_are_refused_naming_their_kind():
    import tensorflow as tf

    from mpi_trainer.trainer.lbfgs import lbfgs_refusal

    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    assert lbfgs_refusal((x, y, None), {}) is None
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    message = lbfgs_refusal((dataset, None, None), {})
    assert message is not None and "full-batch gradients of training rows held as arrays" in message
    assert "Received: x of type" in message and "expected NumPy arrays, or a Keras optimizer" in message
    assert "Received: sample_weight" in lbfgs_refusal((x, y, np.ones(8)), {})
