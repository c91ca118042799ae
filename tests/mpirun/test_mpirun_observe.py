"""A small real job seen every way: end-of-run plots, the report, TensorBoard scalars, the timeline."""

from __future__ import annotations

import json

from conftest import run_mpi
from PIL import Image

from mpi_trainer.reporting.report import make_report
from mpi_trainer.reporting.timeline import PHASES

ROUNDS = 3
PNGS = ("accuracy_loss", "round_time", "worker_train_time", "traffic")


def _check_pngs(report) -> None:
    for name in PNGS:
        with Image.open(report.png(name)) as image:
            assert image.format == "PNG" and image.size[0] >= 800 and image.size[1] >= 400, name
    assert list(report.plots["accuracy_loss"]["test accuracy"]) == list(range(ROUNDS))
    assert len(report.plots["round_time"]["train (fastest worker)"]) == ROUNDS
    for rank in (1, 2):
        assert len(report.plots["worker_train_time"][f"worker rank {rank}"]) == ROUNDS
    assert len(report.plots["traffic"]["sent in the round"]) == ROUNDS


def _check_tensorboard(run_dir) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"metrics/test_accuracy", "traffic/bytes", "time/wall_seconds", "run/max_staleness",
            "workers/train_seconds/rank_1", "workers/train_seconds/rank_2"} <= tags
    assert [e.step for e in events.Scalars("metrics/test_loss")] == list(range(ROUNDS))


def _check_timeline(run_dir) -> None:
    trace = json.loads((run_dir / "timeline.json").read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in events} <= set(PHASES)
    by_rank = {rank: {(e["name"], e["args"]["round"]) for e in events if e["pid"] == rank} for rank in (0, 1, 2)}
    for round_index in range(ROUNDS):
        assert {("wait", round_index), ("aggregate", round_index), ("evaluate", round_index)} <= by_rank[0]
        for worker in (1, 2):
            assert {("wait", round_index), ("train", round_index)} <= by_rank[worker]


def test_a_small_job_writes_plots_tensorboard_and_a_timeline_for_every_rank(tmp_path):
    run_dir = tmp_path / "run"
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", f"train.epochs={ROUNDS}",
                         "--set", "log.timeline=true", "--set", "log.verbosity=2", "--set", "log.plots=true"],
                     run_dir)
    assert result.returncode == 0, result.output
    # Not a terminal here: Keras' one line per epoch, no bar; the workers' log lines tagged with their rank.
    assert f"Epoch {ROUNDS}/{ROUNDS}" in result.output and "━" not in result.output
    assert "[rank 2/3" in result.output
    assert (run_dir / "traffic.png").is_file() and (run_dir / "report.txt").is_file()  # written by train
    report = make_report(run_dir)
    assert "status: epochs" in report.text
    _check_pngs(report)
    _check_tensorboard(run_dir)
    _check_timeline(run_dir)
