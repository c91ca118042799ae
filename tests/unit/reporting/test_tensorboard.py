"""TensorBoard scalars per round, read back with TensorBoard's own event reader; no TensorFlow needed."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from mpi_trainer.reporting.tensorboard import TENSORBOARD_DIR, TensorBoardRounds, round_scalars

ROWS = [{"round": r, "test_accuracy": 0.5 + 0.1 * r, "wall_seconds": 2.0, "bytes": 1000 * (r + 1),
         "max_staleness": r, "val_loss": math.nan, "winner": "", "idle_fraction": 0.25,
         "worker_train_seconds": f"1.5;{1.0 + r}", "block_sizes": "60;40"} for r in range(3)]


def test_every_numeric_column_and_each_worker_becomes_a_scalar():
    scalars = round_scalars(ROWS[1])
    assert scalars == {"metrics/test_accuracy": 0.6, "time/wall_seconds": 2.0, "traffic/bytes": 2000.0,
                       "run/max_staleness": 1.0, "time/idle_fraction": 0.25,
                       "workers/train_seconds/rank_1": 1.5, "workers/train_seconds/rank_2": 2.0,
                       "workers/block_size/rank_1": 60.0, "workers/block_size/rank_2": 40.0}


def test_tensorboards_reader_finds_the_scalars_per_round(tmp_path):
    writer = TensorBoardRounds(tmp_path)
    for row in ROWS:
        writer.write_round(row)
    writer.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / TENSORBOARD_DIR))
    events.Reload()
    assert "metrics/test_accuracy" in events.Tags()["scalars"]
    accuracy = events.Scalars("metrics/test_accuracy")
    assert [e.step for e in accuracy] == [0, 1, 2]
    assert [e.value for e in accuracy] == pytest.approx([0.5, 0.6, 0.7])
    assert [e.value for e in events.Scalars("workers/train_seconds/rank_2")] == pytest.approx([1.0, 2.0, 3.0])


def test_the_writer_imports_no_tensorflow(tmp_path):
    code = ("import sys; from mpi_trainer.reporting.tensorboard import TensorBoardRounds; "
            f"w = TensorBoardRounds({str(tmp_path)!r}); w.write_round({{'round': 0, 'bytes': 5}}); w.close(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'torch', 'jax')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
