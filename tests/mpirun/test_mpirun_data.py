"""Real ``mpirun`` jobs for the data pipeline: shared HDF5 with increment and augmentation,
scatter from a CSV, and bad data failing on every rank."""

from __future__ import annotations

import re
from pathlib import Path

import h5py
import numpy as np
from conftest import ROOT, run_mpi

from mpi_trainer.config import load_config
from mpi_trainer.data.increment import extra_count
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.sources import load_dataset


def _image_h5(path: Path, nan_row: int | None = None) -> Path:
    rng = np.random.default_rng(0)
    centres = rng.integers(0, 256, size=(3, 8, 8))
    y = rng.integers(0, 3, size=360)
    x = np.clip(centres[y] + rng.normal(0, 40, size=(360, 8, 8)), 0, 255).astype(np.float32) / 255
    if nan_row is not None:
        x[nan_row, 3, 3] = np.nan
    with h5py.File(path, "w") as handle:
        handle.create_dataset("x", data=x)
        handle.create_dataset("y", data=y)
    return path


def test_shared_h5_with_random_increment_and_augmentation(tmp_path):
    source = _image_h5(tmp_path / "images.h5")
    overrides = [f"data.source={source}", "data.placement=shared", "model.name=mlp", "train.epochs=3",
                 "aggregation.method=weighted", "data.increment.enabled=true",
                 "data.increment.load_factor=0.1", "data.increment.absolute_factor=0.7",
                 "data.augmentation.enabled=true", "data.augmentation.shift=0.1", "log.verbosity=2",
                 "evaluation.where=workers"]
    result = run_mpi(3, ["train", "configs/quickstart.toml", *[a for o in overrides for a in ("--set", o)]],
                     tmp_path / "run")
    assert result.returncode == 0, result.output
    cfg = load_config("configs/quickstart.toml", overrides)
    total = load_dataset(cfg.data, cfg.train.seed).num_train
    sizes = [end - start for start, end in block_bounds(total, 2)]
    rows = result.rounds()
    for r, row in enumerate(rows):
        expected = sum(s + extra_count(total, s, r, cfg.data.increment) for s in sizes)
        assert int(row["samples"]) == expected > total  # each worker's share grows past its block
    log = (tmp_path / "run" / "train.log").read_text()
    assert "validation data scored by the workers, each on its share" in log  # evaluation.where = "workers"
    assert float(rows[-1]["test_accuracy"]) > 0.8


def test_scatter_sends_rank_0s_rows_to_every_worker_and_counts_the_bytes(tmp_path):
    result = run_mpi(3, ["train", "configs/csv_example.toml", "--set", "data.placement=scatter",
                         "--set", "train.epochs=3"], tmp_path / "run")
    assert result.returncode == 0, result.output
    assert "data.placement = scatter: rank 0 read" in result.output
    summary = result.summary()
    num_train = int(re.search(r": (\d+) train / \d+ validation", summary["dataset"]).group(1))
    round_bytes = sum(int(r["bytes"]) for r in result.rounds())
    assert summary["traffic_bytes"] - round_bytes >= 2 * num_train * 3 * 4  # the training features, to 2 workers
    assert summary["final_test_accuracy"] > 0.7  # 59 % of the rows are one class


def test_nan_in_a_workers_block_fails_every_rank_before_training(tmp_path):
    # the same split as the job's (quickstart holds out a validation split)
    cfg = load_config(ROOT / "configs/quickstart.toml", [f"data.source={_image_h5(tmp_path / 'clean.h5')}"])
    first_train_row = int(load_dataset(cfg.data, cfg.train.seed).train.rows[0])
    source = _image_h5(tmp_path / "dirty.h5", nan_row=first_train_row)
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", f"data.source={source}",
                         "--set", "model.name=mlp"], tmp_path / "run")
    assert result.returncode != 0
    assert result.output.count("dirty.h5: x_train contains NaN or inf values") == 3, result.output
    assert "reported by rank" in result.output
    assert not (tmp_path / "run" / "rounds.csv").exists()
