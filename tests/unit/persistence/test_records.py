"""Run-directory files: atomic checkpoints with backup, rounds.csv, summary.json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mpi_trainer.persistence.checkpoint import backup_path, load_checkpoint, save_checkpoint
from mpi_trainer.persistence.run_files import write_json_atomic


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


def test_json_is_replaced_atomically(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


