"""A run directory holds one fit: another fit is refused naming what differs; the same one finds its run."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.trainer.run_record import FitRecord, fingerprint


def model(units: int = 4, rate: float = 0.001) -> keras.Model:
    built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units), keras.layers.Dense(2)])
    built.compile(keras.optimizers.Adam(rate), "sparse_categorical_crossentropy")
    return built


DATA = (np.arange(30, dtype=np.float32).reshape(10, 3), np.arange(10) % 2, None)


def finished_run(path, print_) -> None:
    record = FitRecord(path, print_, {})
    record.begin(record.open())
    history = keras.callbacks.History()
    history.history, history.epoch = {"loss": [0.5]}, [0]
    record.save_state(np.zeros(4, np.float32), [np.array(3)], 1, history, True)
    record.finish(2)
    record.release()


@pytest.mark.parametrize("change, differs", [
    (lambda: fingerprint(model(8), DATA, {"epochs": 2}, {}), "model"),
    (lambda: fingerprint(model(rate=0.1), DATA, {"epochs": 2}, {}), "compile"),
    (lambda: fingerprint(model(), (DATA[0] * 2, DATA[1], None), {"epochs": 2}, {}), "data"),
    (lambda: fingerprint(model(), DATA, {"epochs": 2, "batch_size": 16}, {}), "arguments"),
])
def test_a_directory_of_another_fit_is_refused_naming_what_differs(tmp_path, change, differs):
    finished_run(tmp_path / "run", fingerprint(model(), DATA, {"epochs": 2}, {}))
    with pytest.raises(ConfigError, match=rf"its [a-z, ]*\b{differs}\b[a-z, ]* differ") as raised:
        FitRecord(tmp_path / "run", change(), {}).open()
    assert "run_dir" in str(raised.value) and "expected a new directory" in str(raised.value)


def test_the_same_fit_finds_its_complete_run_and_its_state(tmp_path):
    same = fingerprint(model(), DATA, {"epochs": 2}, {})
    finished_run(tmp_path / "run", same)
    record = FitRecord(tmp_path / "run", fingerprint(model(), DATA, {"epochs": 2}, {}), {})
    saved = record.open()
    record.release()
    assert saved["complete"] and saved["next_epoch"] == 1 and saved["history"] == {"loss": [0.5]}
    assert int(saved["integers"][0]) == 3
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["rounds_completed"] == 0 and summary["stop_reason"] == "epochs"


def test_no_directory_means_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = FitRecord(None, {}, {})
    assert record.open() is None
    record.begin(None)
    record.finish(2)
    assert list(tmp_path.iterdir()) == []


def test_a_complete_run_found_again_hands_back_its_summary_and_keeps_its_stop_reason(tmp_path):
    same = fingerprint(model(), DATA, {"epochs": 2}, {})
    record = FitRecord(tmp_path / "run", same, {})
    record.begin(record.open())
    record.stopped("callback")
    history = keras.callbacks.History()
    history.history, history.epoch = {"loss": [0.5]}, [0]
    record.save_state(np.zeros(4, np.float32), [np.array(3)], 1, history, True)
    written = record.finish(2)
    record.release()
    again = FitRecord(tmp_path / "run", same, {})
    again.begin(again.open())
    assert again.finish(2) == written  # this job's wall time is not the run's
    (tmp_path / "run" / "summary.json").unlink()
    assert again.finish(2)["stop_reason"] == "callback"  # written again from the run's state
    again.release()


def test_a_directory_holding_a_run_without_a_fingerprint_is_refused_and_left_as_it_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"completed": true}')
    with pytest.raises(ConfigError, match=r"holds a run without a fingerprint \(it has checkpoint.h5 or "
                                          r"summary.json but no fit.json: .*\), which this fit cannot resume"):
        FitRecord(run, fingerprint(model(), DATA, {"epochs": 2}, {}), {}).open()
    assert (run / "summary.json").read_text() == '{"completed": true}' and not (run / "fit.json").exists()


@pytest.mark.parametrize("damage", ["deleted", "cut"])
def test_a_run_whose_latest_checkpoint_is_lost_resumes_from_the_backup_and_says_so(tmp_path, damage, caplog):
    print_ = fingerprint(model(), DATA, {"epochs": 3}, {})
    record = FitRecord(tmp_path / "run", print_, {})
    record.begin(record.open())
    history = keras.callbacks.History()
    for epoch in (0, 1):  # two checkpoints: the first becomes the backup
        history.history, history.epoch = {"loss": [0.5, 0.4][:epoch + 1]}, list(range(epoch + 1))
        record.save_state(np.full(4, epoch, np.float32), [np.array(epoch)], epoch + 1, history, False)
    record.release()
    latest = tmp_path / "run" / "checkpoint.h5"
    if damage == "deleted":
        latest.unlink()
    else:
        latest.write_bytes(latest.read_bytes()[:100])
    again = FitRecord(tmp_path / "run", print_, {})
    saved = again.open()
    again.begin(saved)
    assert saved is not None and saved["next_epoch"] == 1 and saved["state"].tolist() == [0.0] * 4
    assert "trying the backup" in caplog.text and "loaded the backup checkpoint" in caplog.text
    summary = again.finish(1)
    again.release()
    fallback, resumed = summary["survived"]
    assert fallback["event"] == "checkpoint_backup" and "checkpoint.h5" in fallback["passed_over"][0]
    assert resumed == {"event": "resumed", "round": 0} and summary["resumed_after_round"] == 0
