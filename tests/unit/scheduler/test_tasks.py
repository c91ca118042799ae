"""Keras tasks beyond integer classes, end to end in one process: regression, a user-compiled one-hot
model with an extra metric, multi-label targets, metrics as early-stopping monitors, callbacks."""

from __future__ import annotations

import json
import math

import keras
import numpy as np
import pytest
from local_job import run_local_job
from sklearn.datasets import load_diabetes, load_digits

from mpi_trainer.data.readers import RawArrays
from mpi_trainer.models.dry_run import ModelDataMismatch, dry_run


def _npz(path, x, y):
    np.savez(path, x=x.astype(np.float32), y=y)
    return str(path)


def _digits():
    digits = load_digits()
    return digits.data / 16.0, digits.target


def test_regression_on_diabetes_keeps_float_targets_and_logs_its_metric(tmp_path):
    x, y = load_diabetes(return_X_y=True)  # 442 rows; the targets are whole numbers, and not classes
    source = _npz(tmp_path / "diabetes.npz", (x - x.mean(0)) / x.std(0), y / 100.0)
    job = run_local_job(tmp_path / "run", builder=__import__("user_models").regressor, train={"epochs": 6},
                        data={"source": source}, model={"loss": "mse", "metrics": ["mae"], "learning_rate": 0.01},
                        early_stopping={"monitor": "test_mae"})
    rows = job.rounds()
    assert {"test_mae", "train_mae", "val_mae"} <= set(rows[0]) and rows[0]["test_accuracy"] in ("", "nan")
    mae = [float(r["test_mae"]) for r in rows]
    assert mae[-1] < 0.6 * mae[0], mae  # it learns (a constant guess has MAE about 0.65 here)
    summary = json.loads((job.run_dir / "summary.json").read_text())
    assert summary["metrics"] == ["loss", "mae"] and summary["final_test_mae"] == pytest.approx(mae[-1])
    assert summary["best_value"] == pytest.approx(min(mae))  # test_mae is minimised (mode auto)
    assert job.engine.dataset.num_outputs == 1 and not job.engine.dataset.classes


def test_a_user_compiled_one_hot_model_keeps_its_loss_and_metrics(tmp_path):
    x, y = _digits()
    source = _npz(tmp_path / "onehot.npz", x, np.eye(10, dtype=np.float32)[y])
    job = run_local_job(tmp_path / "run", builder=__import__("user_models").compiled_one_hot,
                        data={"source": source}, train={"epochs": 3}, early_stopping={"monitor": "test_auc"})
    assert job.engine.plan.model.user_compiled and job.engine.plan.model.loss == "categorical_crossentropy"
    rows = job.rounds()
    auc = [float(r["test_auc"]) for r in rows]
    assert float(rows[-1]["test_accuracy"]) > 0.85 and auc[-1] > 0.95 and float(rows[-1]["train_auc"]) > 0.9
    assert job.summary["best_value"] == pytest.approx(max(auc))  # AUC is maximised


def test_multi_label_targets_train_a_sigmoid_model_from_the_config(tmp_path):
    x, y = _digits()
    labels = np.stack([y % 2 == 0, y > 4, np.isin(y, [2, 3, 5, 7])], axis=1).astype(np.float32)
    source = _npz(tmp_path / "multi.npz", x, labels)
    job = run_local_job(tmp_path / "run", data={"source": source}, train={"epochs": 4},
                        model={"activation": "sigmoid", "learning_rate": 0.01, "metrics": ["binary_accuracy"]},
                        early_stopping={"monitor": "test_binary_accuracy"})
    assert job.engine.plan.model.loss == "binary_crossentropy"
    assert job.engine.model.outputs[0].shape[-1] == 3
    assert float(job.rounds()[-1]["test_binary_accuracy"]) > 0.85  # per label, over the 3 labels


def test_evaluation_equals_keras_evaluate_for_a_stateful_metric(tmp_path):
    from mpi_trainer.models import evaluate_model

    x, y = _digits()
    model = __import__("user_models").compiled_one_hot((64,), 10)
    one_hot = np.eye(10, dtype=np.float32)[y]
    model.fit(x[:500], one_hot[:500], epochs=1, verbose=0)
    ours = evaluate_model(model, x[500:], one_hot[500:], 256)
    keras_own = model.evaluate(x[500:], one_hot[500:], batch_size=256, verbose=0, return_dict=True)
    for name in ("loss", "accuracy", "auc"):
        assert ours[name] == pytest.approx(keras_own[name], abs=1e-6), name


@pytest.mark.parametrize("build, y, fragment", [
    (lambda: __import__("user_models").compiled_one_hot((64,), 10), np.arange(8) % 10, "loss 'categorical_cross"),
    (lambda: keras.Sequential([keras.Input((64,)), keras.layers.Dense(10, activation="softmax")]),
     np.linspace(0, 1, 8).astype(np.float32), "labels of shape () per sample and dtype float32"),
    (lambda: __import__("user_models").compiled_one_hot((64,), 3), np.eye(4, dtype=np.float32)[np.arange(8) % 4],
     "model output shape (None, 3), labels of shape (4,)"),
])
def test_the_dry_run_names_output_labels_and_loss_and_leaves_the_model_as_it_was(build, y, fragment):
    model = build()
    if getattr(model, "optimizer", None) is None:
        model.compile("adam", "categorical_crossentropy")
    before = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(0).random((8, 64)).astype(np.float32)
    with pytest.raises(ModelDataMismatch, match=r"do not fit together: model output shape .*") as info:
        dry_run(model, x, y)
    assert fragment in str(info.value)
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_passing_dry_run_restores_weights_and_optimizer_and_names_the_metrics():
    model = __import__("user_models").compiled_one_hot((64,), 10)
    x, y = _digits()
    before = [w.copy() for w in model.get_weights()]
    names = dry_run(model, x[:8].astype(np.float32), np.eye(10, dtype=np.float32)[y[:8]])
    assert names == ["loss", "accuracy", "auc"]
    for a, b in zip(before, model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 0


class StopAfter(keras.callbacks.Callback):
    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds, self.seen = rounds, []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append((epoch, dict(logs)))
        # the global model holds the round's aggregated weights: evaluating it gives the logged figure
        if epoch + 1 >= self.rounds:
            self.model.stop_training = True


def test_keras_callbacks_see_each_round_and_can_stop_the_job(tmp_path):
    stopper = StopAfter(2)
    csv_path = tmp_path / "keras.csv"
    job = run_local_job(tmp_path / "run", train={"epochs": 6},
                        callbacks=[stopper, keras.callbacks.CSVLogger(str(csv_path))])
    rows = job.rounds()
    assert len(rows) == 2 and job.summary["stop_reason"] == "callback"
    assert [epoch for epoch, _ in stopper.seen] == [0, 1]
    assert stopper.seen[1][1]["test_accuracy"] == pytest.approx(float(rows[1]["test_accuracy"]))
    logged = csv_path.read_text().splitlines()
    assert logged[0].split(",")[0] == "epoch" and len(logged) == 3 and "test_loss" in logged[0]


def test_keras_early_stopping_and_model_checkpoint_behave_as_in_fit(tmp_path):
    # Keras reads a direction only from val_* and loss names: a test_* metric needs its mode
    early = keras.callbacks.EarlyStopping(monitor="test_accuracy", mode="max", patience=1, min_delta=1.0)
    saved = tmp_path / "best.weights.h5"
    checkpoint = keras.callbacks.ModelCheckpoint(str(saved), monitor="test_accuracy", mode="max",
                                                 save_weights_only=True)
    job = run_local_job(tmp_path / "run", train={"epochs": 6}, callbacks=[early, checkpoint])
    assert len(job.rounds()) == 2 and job.summary["stop_reason"] == "callback" and early.stopped_epoch == 1
    assert saved.is_file()
    twin = keras.models.clone_model(job.engine.model)
    twin.load_weights(saved)
    for a, b in zip(twin.get_weights(), job.engine.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b)  # the last round's global weights


def test_arrays_need_the_api():
    from mpi_trainer.config import config_from_dict
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.errors import DataError

    cfg = config_from_dict({"data": {"source": "arrays"}})
    with pytest.raises(DataError, match="means the arrays passed to mpi_trainer.fit"):
        load_dataset(cfg.data, 0)
    x, y = _digits()
    data = load_dataset(cfg.data, 0, arrays=RawArrays(x, y))
    assert data.num_train + len(data.y_test) == len(y) and data.classes and not math.isnan(data.x_train[0, 0])


def test_a_monitor_the_model_does_not_compute_is_refused_before_training(tmp_path):
    from mpi_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=r"`early_stopping.monitor` names a metric the model does not compute. "
                                          r"Received: early_stopping.monitor='test_auc'; expected one of "
                                          r"\['test_loss', 'test_accuracy'\]"):
        run_local_job(tmp_path / "run", early_stopping={"monitor": "test_auc"})
    assert not (tmp_path / "run").exists()
