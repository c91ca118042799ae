"""Multi-output functional models: ``y`` per output, trained by the workers with Keras' own multi-output
loss and scored per output under the names plain ``model.fit`` gives them."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from local_job import run_local_job
from sklearn.datasets import load_digits

from mpi_trainer.data.targets import pack_targets, unpack_targets
from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.job import JobInputs
from mpi_trainer.launch.keras_args import rank_data
from mpi_trainer.models import evaluate_model, flat_metric_state, metrics_from_flat, summed_metric_state
from mpi_trainer.models.packed_targets import targets_source


def two_heads(compiled: bool = True) -> keras.Model:
    """The digit (10 classes, integer labels) and whether it is even (one sigmoid unit, float targets)."""
    keras.utils.set_random_seed(0)
    pixels = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(16, activation="relu")(pixels)
    digit = keras.layers.Dense(10, activation="softmax", name="digit")(hidden)
    even = keras.layers.Dense(1, activation="sigmoid", name="even")(hidden)
    model = keras.Model(pixels, [digit, even])
    if compiled:
        model.compile(keras.optimizers.Adam(0.01),
                      loss={"digit": "sparse_categorical_crossentropy", "even": "binary_crossentropy"},
                      loss_weights={"digit": 1.0, "even": 0.5},
                      metrics={"digit": ["accuracy"], "even": ["accuracy", keras.metrics.AUC(name="auc")]})
    return model


def digits() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return x, {"digit": data.target.astype(np.int64), "even": (data.target % 2 == 0).astype(np.float32)[:, None]}


def test_targets_pack_in_output_order_and_unpack_to_their_shapes_and_dtypes():
    y = {"even": np.array([[1.0], [0.0], [1.0]], np.float32), "digit": np.array([4, 7, 2])}
    packed, columns = pack_targets(y, ["digit", "even"])
    assert packed.dtype == np.float32 and packed.tolist() == [[4, 1], [7, 0], [2, 1]]
    assert [(c.name, c.start, c.end, c.shape) for c in columns] == [("digit", 0, 1, ()), ("even", 1, 2, (1,))]
    back = unpack_targets(packed[[2, 0]], columns)  # rows move together, as a block or a shuffle moves them
    assert back["digit"].tolist() == [2, 4] and back["digit"].dtype == np.int64
    assert back["even"].tolist() == [[1.0], [1.0]] and back["even"].dtype == np.float32
    as_list, _ = pack_targets([y["digit"], y["even"]], ["digit", "even"])
    np.testing.assert_array_equal(as_list, packed)


def test_every_output_is_split_into_the_same_rows_as_x():
    model, x = two_heads(), np.arange(40, dtype=np.float32).reshape(10, 4)
    y = {"digit": np.arange(10), "even": np.arange(10, 20, dtype=np.float32)[:, None]}
    arrays = rank_data(x, y, None, 0.3, None, model=model)
    held = unpack_targets(arrays.y_val, arrays.target_layout)
    assert arrays.x_val[:, 0].tolist() == [28, 32, 36]  # the last 30 % of x, as Keras takes them
    assert held["digit"].tolist() == [7, 8, 9] and held["even"][:, 0].tolist() == [17, 18, 19]
    kept = unpack_targets(arrays.y, arrays.target_layout)
    assert kept["digit"].tolist() == list(range(7)) and len(kept["even"]) == 7


def test_validation_data_takes_y_per_output_as_a_dict_or_a_list():
    model, (x, y) = two_heads(), digits()
    as_dict = rank_data(x[:100], {k: v[:100] for k, v in y.items()}, None, 0.0,
                        (x[100:130], {k: v[100:130] for k, v in y.items()}), model=model)
    as_list = rank_data(x[:100], [y["digit"][:100], y["even"][:100]], None, 0.0,
                        (x[100:130], [y["digit"][100:130], y["even"][100:130]]), model=model)
    np.testing.assert_array_equal(as_dict.y_val, as_list.y_val)
    assert unpack_targets(as_dict.y_val, as_dict.target_layout)["digit"].tolist() == y["digit"][100:130].tolist()
    one_output = keras.Model(model.inputs, model.outputs[0])
    assert rank_data(x[:5], {"digit": y["digit"][:5]}, None, 0.0, None, model=one_output).target_layout is None


def _refusal(call) -> str:
    with pytest.raises(ConfigError) as info:
        call()
    return str(info.value)


@pytest.mark.parametrize("call, fragments", [
    (lambda m, x, y: rank_data(x, {"digit": y["digit"]}, None, 0.0, None, model=m),
     ["`y` must be keyed by the model's output names", "Received: y keys ['digit']", "expected ['digit', 'even']"]),
    (lambda m, x, y: rank_data(x, [y["digit"]], None, 0.0, None, model=m),
     ["`y` as a list must hold one array per model output", "Received: 1 arrays; expected 2"]),
    (lambda m, x, y: rank_data(x, y, None, 0.0, None, model=lambda shape, n: m),
     ["`y` per output needs `model` as a keras.Model", "Received: y=dict with keys ['digit', 'even']"]),
    (lambda m, x, y: rank_data(x, {**y, "even": y["even"][:3]}, None, 0.0, None, model=m),
     ["same number of rows", "Received: {'digit': 10, 'even': 3}"]),
    (lambda m, x, y: rank_data(x, y, None, 0.0, (x, {**y, "even": y["even"][:, 0]}), model=m),
     ["`validation_data[1]` must hold the same outputs", "'even': ((), 'float32')", "expected {'digit'"]),
    (lambda m, x, y: rank_data(x, y, {"digit": np.ones(10), "even": np.ones(10)}, 0.0, None, model=m),
     ["`sample_weight` per output (a dict or list) is not supported", "Received: sample_weight=dict with keys"]),
])
def test_y_per_output_that_does_not_fit_the_model_is_refused_naming_it(call, fragments):
    model, (x, y) = two_heads(), digits()
    message = _refusal(lambda: call(model, x[:10], {k: v[:10] for k, v in y.items()}))
    assert all(fragment in message for fragment in fragments), message


def test_class_weight_and_an_uncompiled_model_are_refused_as_keras_refuses_them():
    from mpi_trainer.data.weights import check_class_weight

    message = _refusal(lambda: check_class_weight({0: 1.0, 1: 2.0}, two_heads()))
    assert "`class_weight` is only supported for models with a single output" in message
    assert "Received: class_weight={0: 1.0, 1: 2.0} for a model with outputs ['digit', 'even']" in message
    x, y = digits()
    arrays = rank_data(x[:10], {k: v[:10] for k, v in y.items()}, None, 0.0, None, model=two_heads(compiled=False))
    message = _refusal(lambda: targets_source(two_heads(compiled=False), None, arrays.target_layout))
    assert "must be compiled" in message and "not compiled, with outputs ['digit', 'even']" in message


def _job(tmp_path, where: str, placement: str, sync_every: int):
    """fit(model, x, y_dict, validation_data=(xv, yv)) as the job runs it: 3 worker threads, real Keras."""
    model, (x, y) = two_heads(), digits()
    val = {k: v[1500:] for k, v in y.items()}
    arrays = rank_data(x[:1500], {k: v[:1500] for k, v in y.items()}, None, 0.0,
                       (x[1500:], [val["digit"], val["even"]]), model=model)  # a list, in output order
    builder, _ = targets_source(model, None, arrays.target_layout)
    history = keras.callbacks.History()
    job = run_local_job(tmp_path / where, workers=3, builder=builder, callbacks=[history],
                        inputs=JobInputs(arrays=arrays), data={"source": "arrays", "test_size": 0.0,
                                                               "placement": placement},
                        train={"epochs": 2, "batch_size": 32, "sync_every": sync_every}, evaluation={"where": where})
    return job, history, model, (x[1500:], val)


def _plain_keras_names(x: np.ndarray, y: dict[str, np.ndarray]) -> set[str]:
    model = two_heads()
    fitted = model.fit(x[:64], {k: v[:64] for k, v in y.items()}, validation_data=(x[64:96], {
        k: v[64:96] for k, v in y.items()}), epochs=1, verbose=0)
    return set(fitted.history)


# a round is one local epoch of model.fit, or (train.sync_every = steps_per_epoch) that many train_on_batch steps
@pytest.mark.parametrize("where, placement, sync_every", [("scheduler", "shared", 0), ("workers", "scatter", 8)])
def test_logs_carry_plain_keras_names_and_the_per_output_scores_equal_keras_evaluate(tmp_path, where, placement,
                                                                                      sync_every):
    job, history, model, (x_val, y_val) = _job(tmp_path, where, placement, sync_every)
    x, y = digits()
    expected_names = _plain_keras_names(x, y)
    assert "val_even_auc" in expected_names and "digit_loss" in expected_names
    assert set(history.history) == expected_names
    assert len(history.history["digit_loss"]) == len(job.rounds()) == 2 and history.history["val_digit_accuracy"]
    # the scores are the global model's, per output, as model.evaluate gives them on the validation data
    # (in one batch: Keras weights each batch's per-output loss alike, a short last batch too, where the
    # job's figures are means over the samples)
    model.set_weights(job.engine.codec.unflatten(job.engine.weights))
    scores = model.evaluate(x_val, y_val, batch_size=len(x_val), verbose=0, return_dict=True)
    for name, value in scores.items():
        assert history.history[f"val_{name}"][-1] == pytest.approx(value, abs=1e-5), name
    assert float(job.rounds()[-1]["val_even_auc"]) == pytest.approx(scores["even_auc"], abs=1e-5)
    assert scores["digit_accuracy"] > 0.3  # the workers trained the heads (chance: 0.1)


def test_sharded_metric_state_of_the_wrapped_model_adds_up_per_output():
    model, (x, y) = two_heads(), digits()
    arrays = rank_data(x[:200], {k: v[:200] for k, v in y.items()}, None, 0.0, None, model=model)
    wrapped = targets_source(model, None, arrays.target_layout)[0]((64,), 11)
    whole = evaluate_model(wrapped, arrays.x, arrays.y, 64)
    parts = [summed_metric_state(wrapped, arrays.x[rows], arrays.y[rows], 64)
             for rows in (slice(0, 70), slice(70, 200))]
    summed = sum(flat_metric_state(part) for part in parts)
    shards = metrics_from_flat(wrapped, summed)
    assert set(shards) == set(whole) >= {"digit_loss", "even_loss", "even_auc"}
    for name in whole:
        assert shards[name] == pytest.approx(whole[name], abs=1e-6), name


def _batches(structure):
    x, y = digits()
    for start in range(0, 96, 32):
        targets = {k: v[start:start + 32] for k, v in y.items()}
        yield x[start:start + 32], targets if structure is dict else [targets["digit"], targets["even"]]


@pytest.mark.parametrize("make, kind", [
    (lambda: _batches(dict), "generator"),
    (lambda: _batches(list), "generator"),
    (lambda: __import__("tensorflow").data.Dataset.from_generator(
        lambda: _batches(dict), output_signature=(
            __import__("tensorflow").TensorSpec((None, 64), "float32"),
            {"digit": __import__("tensorflow").TensorSpec((None,), "int64"),
             "even": __import__("tensorflow").TensorSpec((None, 1), "float32")})), "tf.data.Dataset"),
])
def test_a_pipeline_yielding_y_per_output_is_refused_naming_its_kind(make, kind):
    from mpi_trainer.data.adapters import fit_input
    from mpi_trainer.errors import DataError

    with pytest.raises(DataError) as info:
        fit_input(make(), None, None, steps_per_epoch=3).first_batch()
    message = str(info.value)
    assert f"A {kind} must yield labels `y` as one array" in message and "Received: batches with y=" in message


def test_lbfgs_is_refused_for_a_multi_output_model():
    from mpi_trainer.config import config_from_dict
    from mpi_trainer.models import build_model

    model, (x, y) = two_heads(), digits()
    arrays = rank_data(x[:10], {k: v[:10] for k, v in y.items()}, None, 0.0, None, model=model)
    builder, _ = targets_source(model, None, arrays.target_layout)
    cfg = config_from_dict({"model": {"optimizer": "lbfgs"}})
    message = _refusal(lambda: build_model(cfg.model, (64,), 2, False, builder))
    assert "`model.optimizer` = 'lbfgs' trains single-output models" in message and "2 outputs" in message


def test_one_sample_weight_array_weights_every_output_as_in_plain_keras():
    model, (x, y) = two_heads(), digits()
    weights = np.linspace(0.0, 2.0, 64).astype(np.float32)
    arrays = rank_data(x[:64], {k: v[:64] for k, v in y.items()}, weights, 0.0, None, model=model)
    wrapped = targets_source(model, None, arrays.target_layout)[0]((64,), 11)
    ours = wrapped.test_on_batch(arrays.x, arrays.y, sample_weight=arrays.sample_weight, return_dict=True)
    plain = model.test_on_batch(x[:64], {k: v[:64] for k, v in y.items()}, sample_weight=weights, return_dict=True)
    assert set(ours) == set(plain)
    for name in plain:
        assert ours[name] == pytest.approx(plain[name], abs=1e-6), name


def test_files_the_wrapped_model_writes_reload_into_the_users_model(tmp_path):
    # ModelCheckpoint, the run's final weights and model.save on rank 0 see the wrapped model
    model, (x, y) = two_heads(), digits()
    arrays = rank_data(x[:64], {k: v[:64] for k, v in y.items()}, None, 0.0, None, model=model)
    wrapped = targets_source(model, None, arrays.target_layout)[0]((64,), 11)
    wrapped.fit(arrays.x, arrays.y, epochs=1, verbose=0)
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "w.weights.h5"), save_weights_only=True)
    checkpoint.set_model(wrapped)
    checkpoint.on_epoch_end(0, {"loss": 1.0})
    wrapped.save(tmp_path / "m.keras")
    fresh = two_heads()
    fresh.load_weights(tmp_path / "w.weights.h5")
    for ours, theirs in zip(fresh.get_weights(), wrapped.get_weights(), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    reloaded = keras.models.load_model(tmp_path / "m.keras")
    assert reloaded.output_names == ["digit", "even"] and type(reloaded).__name__ == "Functional"


def test_dict_inputs_and_outputs_together_score_as_plain_keras(tmp_path):
    keras.utils.set_random_seed(0)
    left, right = keras.Input((32,), name="left"), keras.Input((32,), name="right")
    hidden = keras.layers.Dense(16, activation="relu")(keras.layers.concatenate([left, right]))
    model = keras.Model({"left": left, "right": right}, [keras.layers.Dense(10, activation="softmax", name="digit")(
        hidden), keras.layers.Dense(1, activation="sigmoid", name="even")(hidden)])
    model.compile("adam", loss=["sparse_categorical_crossentropy", "binary_crossentropy"],
                  metrics=[["accuracy"], ["accuracy"]])
    x, y = digits()
    inputs, targets = {"left": x[:96, :32], "right": x[:96, 32:]}, [y["digit"][:96], y["even"][:96]]
    arrays = rank_data(inputs, targets, None, 0.0, None, model=model)
    wrapped = targets_source(model, arrays.input_layout, arrays.target_layout)[0]((64,), 11)
    ours = wrapped.test_on_batch(arrays.x, arrays.y, return_dict=True)
    plain = model.test_on_batch(inputs, targets, return_dict=True)
    assert set(ours) == set(plain) == {"loss", "digit_loss", "even_loss", "digit_accuracy", "even_accuracy"}
    for name in plain:
        assert ours[name] == pytest.approx(plain[name], abs=1e-6), name
    wrapped.save_weights(tmp_path / "w.weights.h5")  # the user's model's weights, not the wrappers'
    model.set_weights([np.zeros_like(w) for w in model.get_weights()])
    model.load_weights(tmp_path / "w.weights.h5")
    assert model.test_on_batch(inputs, targets, return_dict=True)["loss"] == pytest.approx(plain["loss"], abs=1e-6)
