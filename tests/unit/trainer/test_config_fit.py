"""The command line's job (a config naming the model and the data) trained as a keras.Model: every rank reads
the data and builds the model, the Keras fit trains it, and the run directory holds what the command line
writes. A scheduler and two workers as threads of a LocalWorld."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.config import load_config
from mpi_trainer.trainer import config_fit
from mpi_trainer.trainer.config_fit import fit_config
from tests.unit.trainer.test_fit_again import placed_in_place

DIGITS = {"data": {"source": "digits", "test_size": 0.2}, "model": {"name": "mlp", "learning_rate": 0.003},
          "train": {"epochs": 2, "batch_size": 32, "seed": 0}, "checkpoint": {"every": 1},
          "log": {"plots": False, "tensorboard": False}}


@pytest.fixture(autouse=True)
def start_in_place(monkeypatch):
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)
    # the ranks are threads: each seeds Keras and builds its model without another drawing in between, as
    # the processes of a job do
    lock, build = threading.Lock(), config_fit._model

    def seeded_alone(*args: Any) -> Any:
        with lock:
            return build(*args)

    monkeypatch.setattr(config_fit, "_model", seeded_alone)


def train_everywhere(run_dir: Path, overrides: list[str] = (), table: dict[str, Any] = DIGITS,
                     **arguments: Any) -> dict[int, dict[str, Any]]:
    """Every rank's History and weights after ``train`` of ``table`` with ``overrides`` (and ``arguments`` of
    :func:`fit_config`)."""
    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> dict[str, Any]:
        cfg = load_config(table, list(overrides))
        history = fit_config(transports[index], cfg, table, list(overrides), str(run_dir), False, **arguments)
        return {"history": history.history, "epoch": list(history.epoch), "summary": history.summary,
                "weights": history.model.get_weights()}

    return world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=240)


def test_the_configs_model_trains_on_its_data_with_the_same_result_and_files_on_every_rank(tmp_path):
    result = train_everywhere(tmp_path / "run")
    for rank in (1, 2):
        assert result[rank]["history"] == result[0]["history"]
        for mine, theirs in zip(result[rank]["weights"], result[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    assert result[0]["epoch"] == [0, 1]
    assert min(result[0]["history"]["val_accuracy"][-1], result[0]["summary"]["final_test_accuracy"]) > 0.8
    run = tmp_path / "run"
    for name in ("config.toml", "rounds.csv", "summary.json", "train.log", "checkpoint.h5", "final.weights.h5"):
        assert (run / name).exists(), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dataset"].startswith("digits: 1438 train / 0 validation / 359 test samples")
    assert summary["model"] == "mlp" and summary["rounds_completed"] == 2
    # rank 0 waited on the workers, sleeping between polls: a small part of a core, not a spinning one
    assert summary["scheduler_wait_seconds"] >= 0  # threads count only their messages' waits
    assert 0 <= summary["scheduler_wait_cpu_fraction"] < 0.9
    assert summary["traffic_bytes"] > 2 * 2 * summary["model_bytes"]  # the state out and back, each worker, twice


def test_with_a_validation_split_the_fit_validates_on_it_and_the_test_split_fills_the_test_columns(tmp_path):
    result = train_everywhere(tmp_path / "run", ["data.validation_size=0.1", "train.epochs=1"])
    history, summary = result[0]["history"], result[0]["summary"]
    assert {"val_loss", "val_accuracy", "test_loss", "test_accuracy"} <= set(history)
    assert result[2]["history"] == history
    assert summary["final_test_accuracy"] == pytest.approx(history["test_accuracy"][-1])
    assert summary["dataset"].startswith("digits: 1294 train / 144 validation / 359 test samples")


def test_evaluation_every_scores_the_validation_and_test_splits_every_nth_epoch_and_the_last(tmp_path):
    result = train_everywhere(tmp_path / "run", ["data.validation_size=0.1", "train.epochs=3", "evaluation.every=2"])
    history = result[0]["history"]
    assert len(history["loss"]) == 3 and len(history["val_loss"]) == len(history["test_loss"]) == 2
    assert result[1]["history"] == history


def test_augmentation_trains_each_worker_on_transformed_copies_of_its_images(tmp_path):
    augmented = train_everywhere(tmp_path / "augmented", ["data.augmentation.enabled=true", "train.epochs=1"])
    plain = train_everywhere(tmp_path / "plain", ["train.epochs=1"])
    for rank in (1, 2):
        np.testing.assert_array_equal(augmented[rank]["weights"][0], augmented[0]["weights"][0])
    assert not np.array_equal(augmented[0]["weights"][0], plain[0]["weights"][0])
    assert augmented[0]["history"]["val_accuracy"][-1] > 0.5  # shifted digits are still digits


@pytest.mark.parametrize("source", ["h5", "images", "tfrecord"])
def test_a_source_read_as_a_pipeline_trains_each_worker_on_its_share_with_the_same_result_everywhere(tmp_path,
                                                                                                   source):
    from tests.unit.data.test_streaming_files import digits_h5
    from tests.unit.data.test_tfrecords import image_folder, tfrecord_files

    data = {"h5": lambda: [f"data.source='{digits_h5(tmp_path / 'digits.h5') or tmp_path / 'digits.h5'}'",
                           "data.stream=true"],
            "images": lambda: [f"data.source='{image_folder(tmp_path / 'images', classes=3)}'",
                               "data.image_size=[8, 8]", "data.color_mode='grayscale'"],
            "tfrecord": lambda: [f"data.source='{tfrecord_files(tmp_path / 'records')}/digits-*.tfrecord'",
                                 "data.features=['image']", "data.label='label'", "data.feature_shape=[8, 8, 1]"]}
    overrides = [*data[source](), "model.name='lenet'", "train.epochs=3", "train.batch_size=16"]
    result = train_everywhere(tmp_path / "run", overrides)
    for rank in (1, 2):
        assert result[rank]["history"] == result[0]["history"]
        np.testing.assert_array_equal(result[rank]["weights"][0], result[0]["weights"][0])
    assert result[0]["history"]["val_accuracy"][-1] > 0.5, result[0]["history"]


def test_a_complete_run_asked_for_more_epochs_goes_on_from_its_last(tmp_path):
    first = train_everywhere(tmp_path / "run")
    more = train_everywhere(tmp_path / "run", ["train.epochs=3"])
    assert more[0]["epoch"] == [0, 1, 2]
    assert more[0]["history"]["loss"][:2] == first[0]["history"]["loss"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["rounds_completed"] == 3
    again = train_everywhere(tmp_path / "run", ["train.epochs=3"])  # complete: nothing trains
    assert again[0]["history"] == more[0]["history"]
    np.testing.assert_array_equal(again[2]["weights"][0], more[0]["weights"][0])


def test_scattered_data_reaches_the_workers_from_rank_0_and_trains_as_the_shared_copy_does(tmp_path, monkeypatch):
    from mpi_trainer.data import sources

    shared = train_everywhere(tmp_path / "shared", ["train.epochs=1"])
    reads: list[str] = []
    real = sources.load_dataset
    monkeypatch.setattr(sources, "load_dataset", lambda *args, **kwargs: reads.append("read") or real(*args, **kwargs))
    scattered = train_everywhere(tmp_path / "scattered", ["train.epochs=1", "data.placement='scatter'"])
    assert reads == ["read"]  # rank 0 alone read the source
    assert scattered[2]["history"] == scattered[0]["history"] == shared[0]["history"]
    np.testing.assert_array_equal(scattered[1]["weights"][0], shared[0]["weights"][0])


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_a_16_bit_wire_halves_the_models_bytes_and_every_rank_ends_with_rank_0s_state(tmp_path, wire):
    exact = train_everywhere(tmp_path / "float32", ["train.epochs=1", "checkpoint.every=0"])
    narrow = train_everywhere(tmp_path / wire, ["train.epochs=1", "checkpoint.every=0",
                                                f"aggregation.wire_dtype='{wire}'"])
    for rank in (1, 2):  # the final state reaches the workers exactly, as the scorers' does
        for mine, theirs in zip(narrow[rank]["weights"], narrow[0]["weights"], strict=True):
            np.testing.assert_array_equal(mine, theirs)
    sent = [run[0]["summary"]["traffic_bytes"] for run in (exact, narrow)]
    weights = sum(array.nbytes for array in exact[0]["weights"])  # the model's variables; Adam's stay float32
    # one round: the model to each of two workers and back, each copy in half the bytes
    assert sent[0] - sent[1] == pytest.approx(2 * 2 * weights / 2, rel=0.01)
    assert not np.array_equal(narrow[0]["weights"][0], exact[0]["weights"][0])
    assert narrow[0]["history"]["val_accuracy"][-1] > 0.6  # one epoch of an MLP on the digits: well above chance


@pytest.mark.parametrize(("overrides", "named"), [
    (["train.overlap_eval=true", "aggregation.ssp=1"], "train.overlap_eval=True: it hands out a synchronous round"),
    (["aggregation.ssp=1", "aggregation.wire_dtype='float16'"], "cannot be combined with aggregation.wire_dtype"),
])
def test_what_no_fit_applies_is_refused_on_every_rank_before_training(tmp_path, overrides, named):
    from mpi_trainer.errors import InputError

    with pytest.raises(InputError, match=named) as raised:
        train_everywhere(tmp_path / "run", overrides)
    assert "Received:" in str(raised.value)


def test_resume_without_a_run_directory_is_refused_on_every_rank(monkeypatch):
    from mpi_trainer.errors import InputError

    monkeypatch.delenv("MPI_TRAINER_RUN_DIR", raising=False)
    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> str:
        try:
            fit_config(transports[index], load_config(DIGITS), DIGITS, [], None, True)
        except InputError as exc:
            return str(exc)
        return "trained"

    said = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=120)
    for rank_index in range(3):
        assert "`--resume` needs the run directory to continue. Received: no --run-dir" in said[rank_index]


def test_arrays_that_rank_0_did_not_pass_are_refused_on_every_rank():
    from mpi_trainer.errors import InputError
    from mpi_trainer.trainer.config_fit import _same_data

    world = LocalWorld(3)
    transports = world.transports()
    x, y = np.zeros((6, 2)), np.zeros(6)

    def rank(index: int) -> str:
        try:
            _same_data(transports[index], (None, None, None, None) if index == 0 else (x, y, None, None))
        except InputError as exc:
            return str(exc)
        return "trained"

    said = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=60)
    assert all(text.startswith("`x` and `y` are the training data, and rank 0 passed none") for text in said.values())
    assert "(reported by rank 0)" in said[1] and "(reported by rank 0)" not in said[0]


def test_arrays_given_on_rank_0_alone_are_sent_to_every_worker():
    from mpi_trainer.trainer.config_fit import _same_data

    world = LocalWorld(3)
    transports = world.transports()
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6)
    given = {0: (x, y, None, None), 1: (None, None, None, None), 2: (x[::-1], y, None, None)}
    held = world.run({index: lambda index=index: _same_data(transports[index], given[index]) for index in range(3)},
                     timeout=60)
    for index in (1, 2):
        np.testing.assert_array_equal(held[index][0], x)


def test_the_command_lines_fit_honours_backup_and_restore_through_its_run_directorys_checkpoints(tmp_path):
    import keras

    result = train_everywhere(tmp_path / "run", ["train.epochs=2", "checkpoint.every=0"],
                              callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])
    assert result[0]["summary"]["backup_and_restore"] == str(tmp_path / "backup")
    assert (tmp_path / "run" / "checkpoint.h5").exists() and (tmp_path / "run" / "checkpoint.h5.bak").exists()
    assert not (tmp_path / "backup").exists()  # the run directory holds the checkpoints; nothing written there
