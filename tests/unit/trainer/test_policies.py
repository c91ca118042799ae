"""The scheduler's policies on a script's own keras.Model, each set as ``launch --set`` hands it to ``fit``
(a ``KEY=VALUE`` override the script does not name): ``fit_model`` on a scheduler and two workers as threads
of a LocalWorld, each rank with its own copy of the model. Every rank ends with the same weights and History."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import keras
import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.config import read_toml
from mpi_trainer.reporting.rundata import read_complete_rows
from mpi_trainer.trainer.fit import fit_model
from mpi_trainer.trainer.state import ModelState
from tests.unit.trainer.test_fit_again import placed_in_place

rng = np.random.default_rng(1)
X = rng.normal(size=(160, 6)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int64") + (X[:, 2] > 0.5).astype("int64")


def model() -> keras.Model:
    keras.utils.set_random_seed(7)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    built.compile(keras.optimizers.Adam(0.02), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return built


def fit_set(overrides: list[str], run_dir: Any = None, epochs: int = 3, **kwargs: Any) -> dict[int, dict[str, Any]]:
    """Every rank's History, weights and summary after the script's fit with ``overrides`` set from outside."""
    world = LocalWorld(3)
    transports = world.transports()
    models = {rank: model() for rank in range(3)}

    def rank(index: int) -> dict[str, Any]:
        arguments = {"x": X, "y": Y, "batch_size": 16, "epochs": epochs, "verbose": 0, "validation_split": 0.25,
                     "shuffle": True, "initial_epoch": 0, "validation_freq": 1, **kwargs}
        history = fit_model(transports[index], models[index], arguments, None, overrides, run_dir, False)
        return {"history": history.history, "epoch": list(history.epoch), "summary": history.summary,
                "rounds": history.rounds, "weights": models[index].get_weights(),
                "rate": float(models[index].optimizer.learning_rate), "state_bytes": ModelState(models[index]).nbytes,
                "moments": [np.asarray(v) for v in models[index].optimizer.variables if "float" in str(v.dtype)]}

    return world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=120)


@pytest.fixture(autouse=True)
def start_in_place(monkeypatch):
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)


def same_everywhere(result: dict[int, dict[str, Any]]) -> None:
    for rank in (1, 2):
        assert result[rank]["history"] == result[0]["history"]
        assert result[rank]["epoch"] == result[0]["epoch"]
        for mine, theirs in zip(result[rank]["weights"], result[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, theirs)


def test_best_of_keeps_one_workers_state_an_epoch_and_says_which():
    result = fit_set(["aggregation.method=best"])
    same_everywhere(result)
    assert set(result[0]["rounds"]["winner"]) <= {1, 2}
    assert len(result[0]["history"]["val_loss"]) == 3


def test_weighted_and_sync_every_train_and_agree_everywhere():
    for overrides in (["aggregation.method=weighted"], ["train.sync_every=2"]):
        result = fit_set(overrides)
        same_everywhere(result)
        assert result[0]["history"]["loss"][-1] < result[0]["history"]["loss"][0], overrides
        summary = result[0]["summary"]
        assert summary["kept_round"] == summary["final_round"] == 2  # no callback restored other weights
        assert summary["final_test_accuracy"] == pytest.approx(result[0]["history"]["val_accuracy"][-1])


def test_evaluation_every_scores_every_nth_epoch_and_the_last_when_the_call_leaves_validation_freq_out():
    result = fit_set(["evaluation.every=2"], epochs=5, validation_freq="config")
    same_everywhere(result)
    assert len(result[0]["history"]["val_loss"]) == 3  # epochs 2, 4 and 5 of 5
    scored = [not np.isnan(value) for value in result[0]["rounds"]["test_loss"]]
    assert scored == [False, True, False, True, True]
    assert len(fit_set(["evaluation.every=2"], epochs=5, validation_freq=1)[0]["history"]["val_loss"]) == 5


def test_a_sync_warm_up_combines_every_few_steps_for_its_epochs_then_once_an_epoch(tmp_path):
    warm = fit_set(["train.sync_warmup_epochs=1", "train.sync_warmup_every=2"], tmp_path / "warm", epochs=2)
    same_everywhere(warm)
    # 60 rows a worker, 4 batches of 16: two rounds in the warm-up epoch, one after it
    # each round counted (its sum in and the state back out), and the first epoch the initial state to 2 workers
    assert warm[0]["rounds"]["bytes"][0] == 2 * warm[0]["rounds"]["bytes"][1] + 2 * warm[0]["state_bytes"]
    first = fit_set(["train.sync_warmup_epochs=1", "train.sync_warmup_every=2"], epochs=1)
    for warmed, every_two in zip(first[0]["weights"], fit_set(["train.sync_every=2"], epochs=1)[0]["weights"],
                                 strict=True):
        np.testing.assert_array_equal(warmed, every_two)  # the warm-up epoch is sync_every's


def test_increment_grows_each_workers_rows_epoch_by_epoch(tmp_path):
    # 120 training rows, 60 a worker; a draw of 12 more (0.1 of 120) each epoch, up to 0.8 of the rows (96)
    result = fit_set(["data.increment.enabled=true", "data.increment.load_factor=0.1"], tmp_path / "run", epochs=4)
    same_everywhere(result)
    assert result[0]["rounds"]["samples"] == [2 * (60 + 12), 2 * (60 + 24), 2 * (60 + 36), 2 * (60 + 36)]
    recorded = read_toml(tmp_path / "run" / "config.toml")  # the run record holds what was set from outside
    assert recorded["data"]["increment"]["enabled"] is True and recorded["data"]["increment"]["load_factor"] == 0.1


def test_increment_with_a_pipeline_is_refused_naming_what_it_needs():
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    with pytest.raises(Exception, match="data.increment.*Received: data.increment.enabled=True with x of kind"):
        fit_set(["data.increment.enabled=true"], x=dataset, y=None, validation_split=None)


# worker rank 2 ends itself as kill -9 would while it trains epoch 1
LOSE_RANK_2 = ["debug.crash_rank=2", "debug.crash_round=1", "debug.crash_phase=train"]


def test_survive_a_worker_lost_mid_run_leaves_the_other_to_finish_every_epoch():
    result = fit_set(["fault.survive=true", *LOSE_RANK_2])
    assert result[2] is None  # lost
    survivors = {rank: result[rank] for rank in (0, 1)}
    same_everywhere({**survivors, 2: survivors[1]})
    assert survivors[0]["epoch"] == [0, 1, 2]
    assert survivors[0]["rounds"]["workers"] == [2, 1, 1]
    assert survivors[0]["rounds"]["samples"] == [120, 120, 120]  # the survivor takes every row
    summary = survivors[0]["summary"]
    assert [lost["rank"] for lost in summary["lost_workers"]] == [2] and summary["workers"] == 1


def test_without_survive_a_lost_worker_ends_the_job():
    from mpi_trainer.errors import RankLost

    with pytest.raises(RankLost):
        fit_set(LOSE_RANK_2)


def test_ssp_lets_a_fast_worker_run_ahead_within_the_bound_and_every_rank_ends_alike():
    # worker rank 1 takes four times as long a batch: rank 2 runs ahead, at most 2 epochs
    result = fit_set(["aggregation.ssp=2", "debug.batch_delay=0.004", "debug.slow_ranks=[1]",
                      "debug.slow_factor=4"], epochs=6)
    same_everywhere(result)
    staleness = result[0]["rounds"]["max_staleness"]
    assert 1 <= max(staleness) <= 2 and min(staleness) >= 0, staleness  # ahead, never past the bound
    history = result[0]["history"]
    assert len(history["val_loss"]) == 6 and history["loss"][-1] < history["loss"][0]
    assert result[0]["summary"]["ssp"] == 2


def test_rebalance_gives_a_slow_worker_fewer_rows_and_every_rank_ends_alike(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    # worker rank 1 takes four times as long a batch; after its first epoch each worker is timed
    result = fit_set(["data.rebalance=true", "data.rebalance_smoothing=1", "debug.batch_delay=0.01",
                      "debug.slow_ranks=[1]", "debug.slow_factor=4"], tmp_path / "run", epochs=4)
    same_everywhere(result)
    rows = read_complete_rows(tmp_path / "run" / "rounds.csv")
    blocks = [[int(size) for size in row["block_sizes"].split(";")] for row in rows]
    assert blocks[0] == blocks[1] == [60, 60], blocks  # even, until both were timed past their first epoch
    assert all(sum(sizes) == 120 for sizes in blocks) and blocks[-1][0] < 50, blocks
    assert "the workers' blocks were re-cut by their speed" in caplog.text


def on_gpus(transport: Any, cfg: Any) -> tuple[Any, list[Any]]:
    """As :func:`placed_in_place`, every worker described as on a GPU of its own."""
    cfg, placements = placed_in_place(transport, cfg)
    return cfg, [placement if placement.is_scheduler else dataclasses.replace(placement, device=f"cuda:{index}")
                 for index, placement in enumerate(placements)]


def test_by_default_the_workers_score_where_every_one_is_on_a_gpu_and_the_scores_are_rank_0s(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    alone = fit_set([])
    assert 'evaluation.where = "auto": worker rank(s) [1, 2] train on the CPU' in caplog.text
    assert "validation data scored on rank 0" in caplog.text
    caplog.clear()
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", on_gpus)
    shared = fit_set([])
    assert "every worker trains on a GPU" in caplog.text
    assert "validation data scored by the workers, each on its share" in caplog.text
    same_everywhere(shared)
    for key in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(shared[0]["history"][key], alone[0]["history"][key], rtol=1e-5)


def test_rebalance_of_a_pipeline_or_with_a_step_budget_is_refused_naming_what_it_needs():
    import tensorflow as tf

    from mpi_trainer.config import load_config
    from mpi_trainer.errors import ConfigError
    from mpi_trainer.trainer.fit_input import check_input

    check_input(load_config({}, ["data.rebalance=true"]), {"x": X})
    with pytest.raises(ConfigError, match=r"Received: data.rebalance=True with x of kind 'tf.data.Dataset'"):
        check_input(load_config({}, ["data.rebalance=true"]), {"x": tf.data.Dataset.from_tensor_slices(X)})
    with pytest.raises(ConfigError, match=r"`data.rebalance` = True cannot be combined with train.max_steps=5: .*"
                                          r"expected train.max_steps = 0, or data.rebalance = false"):
        load_config({}, ["data.rebalance=true", "train.max_steps=5"])  # before any input is seen
    with pytest.raises(ConfigError, match=r"`data.rebalance` = True cannot be combined with "
                                          r"data.increment.enabled=True"):
        load_config({}, ["data.rebalance=true", "data.increment.enabled=true"])


def test_ssp_with_best_of_is_refused_naming_both():
    with pytest.raises(Exception, match=r"`aggregation.ssp` = 1 cannot be combined with aggregation.method='best'"):
        fit_set(["aggregation.ssp=1", "aggregation.method=best"])


class Worsening(keras.callbacks.Callback):
    """Rank 0's logs say the validation loss got worse from epoch 1 on, whatever training does."""

    best: list = []

    def on_epoch_end(self, epoch, logs=None):
        logs["val_loss"] = 1.0 + epoch
        if epoch == 0:
            self.best = self.model.get_weights()


def test_patience_stops_with_keras_early_stopping_and_restores_the_best_weights():
    worsening = Worsening()
    result = fit_set(["early_stopping.patience=2", "early_stopping.monitor=val_loss"], epochs=8,
                     callbacks=[worsening])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1, 2]  # epoch 0 best, then 2 without improvement
    for final, best in zip(result[0]["weights"], worsening.best, strict=True):  # every rank: epoch 0's weights
        np.testing.assert_array_equal(final, best)
    summary, history = result[0]["summary"], result[0]["history"]
    assert summary["stop_reason"] == "callback"
    # summary.json describes the model the fit ends with: epoch 0's, not the last epoch's
    assert (summary["final_round"], summary["kept_round"]) == (2, 0)
    assert summary["final_test_accuracy"] == pytest.approx(history["val_accuracy"][0])
    assert summary["final_train_loss"] == pytest.approx(history["loss"][0])


def test_patience_on_a_metric_the_model_does_not_compute_is_named():
    with pytest.raises(Exception, match=r"`early_stopping.monitor` = 'val_auc' watches 'val_auc'.*Received logs"):
        fit_set(["early_stopping.patience=2", "early_stopping.monitor=val_auc"])


def test_patience_on_held_out_rows_without_validation_data_is_refused():
    with pytest.raises(Exception, match=r"holds none out. Received: early_stopping.patience=2"):
        fit_set(["early_stopping.patience=2"], validation_split=None)


class Keep(keras.callbacks.Callback):
    """Rank 0 keeps the model's weights after each epoch's callbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.weights: list = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append(self.model.get_weights())


def test_a_non_finite_epoch_stops_the_fit_with_the_state_before_it():
    kept = Keep()
    result = fit_set(["debug.nan_rank=1", "debug.nan_round=1"], callbacks=[kept])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1] and result[0]["summary"]["stop_reason"] == "nan"
    for final, first in zip(result[0]["weights"], kept.weights[0], strict=True):
        np.testing.assert_array_equal(final, first)  # epoch 1 never reached the model


def test_rollback_trains_the_epoch_again_at_half_the_learning_rate():
    result = fit_set(["debug.nan_rank=1", "debug.nan_round=1", "train.nan_policy=rollback"])
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1, 2] and result[0]["summary"]["stop_reason"] == "epochs"
    assert all(np.isfinite(weights).all() for weights in result[0]["weights"])
    assert result[0]["rounds"]["workers"] == [2, 2, 2]
    assert [result[rank]["rate"] for rank in range(3)] == [pytest.approx(0.01)] * 3  # 0.02 halved once
    summary = result[0]["summary"]
    assert summary["nan_rollbacks"] == 1
    (rollback,) = summary["survived"]
    assert rollback["event"] == "nan_rollback" and rollback["round"] == 1
    assert "non-finite" in rollback["cause"] and rollback["learning_rates"] == [pytest.approx(0.01)]


def test_a_loss_climbing_from_its_first_epoch_is_named_and_stops_the_fit_when_asked():
    result = fit_set(["train.divergence=stop", "train.divergence_rounds=2"], epochs=6, callbacks=[Worsening()])
    assert result[0]["epoch"] == [0, 1, 2]
    assert result[0]["summary"]["stop_reason"] == "diverged"
    assert "val_loss 3 has been above its first round's 1 for 2 rounds" in result[0]["summary"]["divergence"]["cause"]


def test_max_steps_stops_on_exactly_that_many_steps_dealt_out_to_the_workers(tmp_path):
    # 120 training rows, 60 a worker in batches of 16: 4 steps each, 8 an epoch; 13 = 8 + 3 + 2
    result = fit_set(["train.max_steps=13", "log.plots=false"], tmp_path / "run", epochs=5)
    same_everywhere(result)
    assert result[0]["epoch"] == [0, 1] and result[0]["summary"]["stop_reason"] == "max_steps"
    assert result[0]["rounds"]["steps"] == [8, 5]
    assert result[0]["rounds"]["samples"] == [120, 16 * 5]


def test_a_fit_with_a_run_directory_writes_the_command_lines_files(tmp_path):
    fit_set(["train.epochs=2", "log.timeline=true"], tmp_path / "run", epochs=2)
    written = {path.name for path in (tmp_path / "run").iterdir()}
    assert {"config.toml", "rounds.csv", "summary.json", "train.log", "report.txt", "tensorboard",
            "timeline.json"} <= written
    trace = json.loads((tmp_path / "run" / "timeline.json").read_text())["traceEvents"]
    phases = {(event["pid"], event["name"]) for event in trace if event["ph"] == "X"}
    assert {(1, "train"), (2, "train"), (0, "wait"), (0, "aggregate"), (0, "evaluate")} <= phases
    assert {event["args"]["round"] for event in trace if event["ph"] == "X"} == {0, 1}
    assert {"accuracy_loss.png", "round_time.png", "traffic.png"} <= written, written
    events = list((tmp_path / "run" / "tensorboard").iterdir())
    assert events and events[0].stat().st_size > 0
    elapsed = [float(row["elapsed_seconds"]) for row in read_complete_rows(tmp_path / "run" / "rounds.csv")]
    assert 0 < elapsed[0] < elapsed[1]  # the run's seconds at the end of each epoch, as the command line's


def test_augmentation_of_rows_that_are_not_images_is_refused_naming_their_shape():
    with pytest.raises(Exception, match=r"needs image data of shape \(height, width, channels\)\. Received: "
                                        r"data.augmentation.enabled=True with input shape \(6,\)"):
        fit_set(["data.augmentation.enabled=true"])


def test_max_steps_with_a_pipeline_is_refused_naming_what_it_needs():
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    with pytest.raises(Exception, match=r"`train.max_steps` deals the steps left.*Received: train.max_steps=5 with x "
                                        r"of kind 'tf.data.Dataset'"):
        fit_set(["train.max_steps=5"], x=dataset, y=None, validation_split=None)


def test_fewer_survivors_than_min_workers_checkpoint_and_end_the_job(tmp_path):
    from mpi_trainer.errors import WorkerFailure

    with pytest.raises(WorkerFailure, match=r"1 workers left, fewer than fault.min_workers=2; checkpointed before "
                                            r"epoch 1"):
        fit_set(["fault.survive=true", "fault.min_workers=2", *LOSE_RANK_2], tmp_path / "run")
    assert (tmp_path / "run" / "checkpoint.h5").exists()  # the same fit, run again by launch, resumes from here


def test_sync_every_auto_takes_the_steps_chosen_from_the_second_round_and_says_so(monkeypatch, caplog):
    from mpi_trainer.trainer import sync_choice

    caplog.set_level(logging.INFO, logger="mpi_trainer")
    measured = []

    def steps_for(other, step, epoch_steps, share=sync_choice.SHARE):
        measured.append((other, step, epoch_steps))
        return 2

    monkeypatch.setattr(sync_choice, "steps_for", steps_for)
    result = fit_set(["train.sync_every=auto"], epochs=4)
    same_everywhere(result)
    # 60 rows a worker, 4 batches of 16: epochs 0 and 1 are one round each, the second measured; later epochs
    # two rounds of 2 steps
    (other, step, epoch_steps), = measured
    assert epoch_steps == 4 and step > 0 and other > 0
    bytes_ = result[0]["rounds"]["bytes"]
    assert bytes_[0] == bytes_[1] + 2 * result[0]["state_bytes"]  # the initial state to 2 workers
    assert bytes_[2:] == [2 * bytes_[1]] * 2
    assert "train.sync_every = auto: 2 steps a round" in caplog.text
    assert result[0]["history"]["loss"][-1] < result[0]["history"]["loss"][0]


def test_sync_every_auto_trains_whole_epochs_where_the_fit_allows_no_rounds_of_steps(caplog):
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    result = fit_set(["train.sync_every=auto", "data.increment.enabled=true"], epochs=2)
    same_everywhere(result)
    assert "train.sync_every = auto: one round per epoch (data.increment is enabled)" in caplog.text


def test_sync_every_auto_with_a_pipeline_trains_whole_epochs_and_says_why(caplog):
    import tensorflow as tf

    caplog.set_level(logging.INFO, logger="mpi_trainer")
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(16)
    result = fit_set(["train.sync_every=auto"], x=dataset, y=None, validation_split=None, epochs=2)
    same_everywhere(result)
    assert "train.sync_every = auto: one round per epoch (the input is not arrays given as `x`)" in caplog.text


def test_optimizer_state_local_keeps_each_workers_moments_and_sends_only_the_models_state():
    combined = fit_set([], epochs=2)
    local = fit_set(["aggregation.optimizer_state=local"], epochs=2)
    same_everywhere(local)  # every rank ends with the same weights
    assert local[0]["summary"]["steps"] == combined[0]["summary"]["steps"]
    # what travels: the model's weights and the learning rate, without Adam's two moments (a third of the state)
    assert sum(local[0]["rounds"]["bytes"]) < 0.6 * sum(combined[0]["rounds"]["bytes"])
    assert local[0]["history"]["loss"][-1] < local[0]["history"]["loss"][0]
    assert local[0]["rate"] == pytest.approx(0.02)
    moments = [[result[rank]["moments"] for rank in (1, 2)] for result in (combined, local)]
    assert all(np.allclose(a, b) for a, b in zip(*moments[0]))  # combined: every worker holds the same moments
    assert not all(np.allclose(a, b) for a, b in zip(*moments[1]))  # local: each worker its own


def test_optimizer_state_local_is_refused_where_no_average_is_taken():
    with pytest.raises(Exception, match="`aggregation.optimizer_state` = 'local' cannot be combined with "
                                        "aggregation.method='best'"):
        fit_set(["aggregation.optimizer_state=local", "aggregation.method=best"])
