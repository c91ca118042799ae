"""Run-directory files: atomic checkpoints with backup, rounds.csv, summary.json."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from mpi_trainer.persistence.checkpoint import backup_path, load_checkpoint, save_checkpoint
from mpi_trainer.persistence.run_files import RoundLog, read_rounds, write_json_atomic
from mpi_trainer.reporting.table import format_round_line, format_table


def test_checkpoint_round_trip_keeps_previous_as_backup(tmp_path):
    path = tmp_path / "checkpoint.h5"
    save_checkpoint(path, {"weights": np.arange(3, dtype=np.float32)}, {"round": 0})
    save_checkpoint(path, {"weights": np.arange(3, dtype=np.float32) + 1}, {"round": 1})
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 1
    np.testing.assert_array_equal(arrays["weights"], [1, 2, 3])
    assert backup_path(path).exists()
    assert not path.with_name("checkpoint.h5.tmp").exists()


def test_torn_latest_checkpoint_falls_back_to_backup(tmp_path, caplog):
    path = tmp_path / "checkpoint.h5"
    save_checkpoint(path, {"weights": np.zeros(4, np.float32)}, {"round": 4})
    save_checkpoint(path, {"weights": np.ones(4, np.float32)}, {"round": 5})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])  # a write cut short
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 4
    np.testing.assert_array_equal(arrays["weights"], np.zeros(4))


def test_no_readable_checkpoint_says_so(tmp_path):
    with pytest.raises(FileNotFoundError, match="no readable checkpoint"):
        load_checkpoint(tmp_path / "checkpoint.h5")


def test_round_log_writes_header_once_and_appends(tmp_path):
    path = tmp_path / "rounds.csv"
    log = RoundLog(path, ["round", "test_accuracy"])
    log.write({"round": 0, "test_accuracy": 0.5})
    log.close()
    log = RoundLog(path, ["round", "test_accuracy"])
    log.write({"round": 1, "test_accuracy": 0.123456789})
    log.close()
    assert path.read_text().count("round,test_accuracy") == 1
    rows = read_rounds(path)
    assert [r["round"] for r in rows] == ["0", "1"] and rows[1]["test_accuracy"] == "0.123456789"
    with pytest.raises(ValueError):
        RoundLog(path, ["round"]).write({"round": 2, "surprise": 1})


def test_json_is_replaced_atomically(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_round_line_and_table():
    rows = [{"round": 0, "test_accuracy": 0.9, "test_loss": 0.3, "wall_seconds": 1.5, "bytes": 2_000_000},
            {"round": 1, "test_accuracy": 0.95, "test_loss": 0.2, "wall_seconds": 0.5, "bytes": 1_000_000}]
    assert format_round_line(rows[1], 10) == "round 2/10  acc 0.9500  loss 0.2000  0.50 s  1.00 MB"
    unscored = {**rows[1], "test_accuracy": "nan", "test_loss": "nan"}
    assert format_round_line(unscored, 10) == "round 2/10  not scored  0.50 s  1.00 MB"
    regression = {**rows[1], "test_accuracy": "nan"}
    assert format_round_line(regression, 10) == "round 2/10  loss 0.2000  0.50 s  1.00 MB"
    validated = {**unscored, "val_accuracy": 0.875, "val_loss": 0.25}  # fit(validation_data=...), no test split
    assert format_round_line(validated, 10) == "round 2/10  val acc 0.8750  val loss 0.2500  0.50 s  1.00 MB"
    assert format_round_line({**validated, "val_loss": ""}, 10) == "round 2/10  not scored  0.50 s  1.00 MB"
    table = format_table(rows)
    assert "total" in table and "2.00" in table and "3.000" in table


def test_round_log_rewrites_a_resumed_file_written_with_other_columns(tmp_path):
    path = tmp_path / "updates.csv"
    log = RoundLog(path, ["round", "old_only", "share"])
    log.write({"round": 0, "old_only": "x", "share": 0.5})
    log.close()
    log = RoundLog(path, ["round", "share", "val_accuracy"])  # a later version adds a column
    log.write({"round": 1, "share": 0.25, "val_accuracy": 0.9})
    log.close()
    with path.open(newline="") as handle:
        lines = list(csv.reader(handle))
    assert lines[0] == ["round", "share", "val_accuracy", "old_only"]
    assert all(len(line) == 4 for line in lines)  # one width: every CSV reader can take it
    rows = read_rounds(path)
    assert rows[0] == {"round": "0", "share": "0.5", "val_accuracy": "", "old_only": "x"}
    assert rows[1] == {"round": "1", "share": "0.25", "val_accuracy": "0.9", "old_only": ""}
