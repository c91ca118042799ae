"""The report: run-directory reading (torn line, in-progress run), the PNGs and report.txt."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PIL import Image

from mpi_trainer.cli import main
from mpi_trainer.errors import InputError
from mpi_trainer.reporting.plots import minimum_round_bytes, time_parts
from mpi_trainer.reporting.report import make_report
from mpi_trainer.reporting.rundata import load_run

COLUMNS = ["round", "wall_seconds", "train_seconds_max", "train_seconds_min", "comm_seconds",
           "aggregate_seconds", "eval_seconds", "bytes", "test_loss", "test_accuracy", "max_staleness",
           "val_loss", "val_accuracy", "block_sizes", "worker_train_seconds"]
MODEL_BYTES = 1000


def _row(index: int, per_worker: bool = True) -> dict:
    fast, slow = 1.0 + 0.1 * index, 1.5 + 0.1 * index
    return {"round": index, "wall_seconds": slow + 0.6, "train_seconds_max": slow, "train_seconds_min": fast,
            "comm_seconds": 0.2, "aggregate_seconds": 0.1, "eval_seconds": 0.25, "bytes": 4100 + index,
            "test_loss": 1.0 / (index + 1), "test_accuracy": 0.5 + 0.05 * index, "max_staleness": 0,
            "val_loss": "", "val_accuracy": "", "block_sizes": f"{100 + index};{100 - index}",
            "worker_train_seconds": f"{fast:.4g};{slow:.4g}" if per_worker else ""}


def write_run(run_dir, rounds: int, summary: dict | None = None, per_worker: bool = True, torn: str = ""):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "rounds.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(_row(i, per_worker) for i in range(rounds))
        handle.write(torn)
    base = {"workers": 2, "model_bytes": MODEL_BYTES, "aggregation": "average", "ssp": 0,
            "stop_reason": "running", "rounds_completed": rounds, "best_round": rounds - 1,
            "monitor": "test_accuracy", "wall_seconds": 12.5, "traffic_bytes": 50_000}
    (run_dir / "summary.json").write_text(json.dumps({**base, **(summary or {})}))
    return run_dir


def test_a_torn_last_line_is_left_out_and_per_worker_cells_are_split(tmp_path):
    run = write_run(tmp_path / "run", 4, torn="4,2.1,1.9")  # a row cut short by a crash
    data = load_run(run)
    assert data.rounds == [0, 1, 2, 3]
    assert data.columns["worker_train_seconds"][2] == [1.2, 1.7]
    assert data.columns["block_sizes"][3] == [103.0, 97.0]
    assert np.isnan(data.columns["val_loss"][0]) and not data.has("val_loss")


def test_a_directory_without_rounds_says_what_is_expected(tmp_path):
    with pytest.raises(InputError, match=r"No rounds.csv.*Received: run_dir=.*expected the --run-dir"):
        load_run(tmp_path)


def test_report_writes_four_readable_pngs_with_every_round_plotted(tmp_path):
    run = write_run(tmp_path / "run", 5, {"stop_reason": "early_stopping", "best_round": 2})
    report = make_report(run)
    assert set(report.plots) == {"accuracy_loss", "round_time", "worker_train_time", "traffic"}
    for name in report.plots:
        with Image.open(report.png(name)) as image:
            assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 400
    accuracy = report.plots["accuracy_loss"]
    assert list(accuracy["test accuracy"]) == [0, 1, 2, 3, 4]
    assert list(accuracy["best round 2"]) == [2]
    assert list(accuracy["early stop after round 4"]) == [4, 4]  # a vertical line at the last round
    assert "val accuracy" not in accuracy  # an empty column is not drawn
    assert len(report.plots["round_time"]["communication"]) == 5
    assert list(report.plots["worker_train_time"]["worker rank 2"]) == [0, 1, 2, 3, 4]
    assert len(report.plots["traffic"]["sent in the round"]) == 5
    minimum = [label for label in report.plots["traffic"] if label.startswith("minimum per round: 2·M·W")]
    assert minimum and len(report.plots["traffic"][minimum[0]]) == 5


def test_without_per_worker_times_the_slowest_and_fastest_are_drawn(tmp_path):
    report = make_report(write_run(tmp_path / "run", 3, per_worker=False))
    series = report.plots["worker_train_time"]
    assert "worker rank 1" not in series
    assert len(series["slowest worker"]) == 3 and len(series["fastest worker"]) == 3


def test_time_parts_add_up_to_the_round_wall_time(tmp_path):
    data = load_run(write_run(tmp_path / "run", 3))
    parts = time_parts(data)
    np.testing.assert_allclose(sum(parts.values()), data.columns["wall_seconds"])
    np.testing.assert_allclose(parts["waiting for stragglers (slowest − fastest)"], [0.5, 0.5, 0.5])


def test_minimum_traffic_is_the_state_to_each_worker_and_back():
    assert minimum_round_bytes(1000, 3) == 6000


def test_report_text_has_the_table_totals_and_an_in_progress_status(tmp_path):
    run = write_run(tmp_path / "run", 3)
    text = make_report(run, plots=False).text
    assert "running or interrupted after 3 rounds" in text
    assert "total time: 12.50 s" in text and "total traffic: 0.050 MB" in text
    assert text.count("\n    1    0.5500") == 1
    assert (run / "report.txt").read_text() == text
    assert not (run / "traffic.png").exists()


def test_report_command_prints_the_table_and_the_plots(tmp_path, capsys):
    run = write_run(tmp_path / "run", 2)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert "round  accuracy" in out and f"plot: {run / 'traffic.png'}" in out
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "No rounds.csv in the run directory" in capsys.readouterr().err
