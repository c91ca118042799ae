"""A resumed run's TensorBoard events and timeline hold each round once."""

from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mpi_trainer.reporting.tensorboard import TensorBoardRounds
from mpi_trainer.reporting.timeline import Timeline


def _row(round_index: int) -> dict:
    return {"round": round_index, "test_accuracy": 0.5 + round_index / 100, "bytes": 10}


def _steps(run_dir) -> list[int]:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars("metrics/test_accuracy")]


def test_tensorboard_is_rebuilt_from_the_rounds_kept_on_resume(tmp_path):
    first = TensorBoardRounds(tmp_path)
    for index in range(5):  # the attempt that crashed after round 4; its checkpoint was of round 2
        first.write_round(_row(index))
    first.close()
    resumed = TensorBoardRounds(tmp_path, [_row(index) for index in range(3)])
    for index in range(3, 6):
        resumed.write_round(_row(index))
    resumed.close()
    assert _steps(tmp_path) == [0, 1, 2, 3, 4, 5]


def test_the_timeline_drops_an_earlier_attempts_rounds_after_the_checkpoint(tmp_path):
    timeline = Timeline()
    for index in range(5):
        timeline.add(1, "train", index, index + 0.5, index)
    timeline.write(tmp_path / "timeline.json")
    kept = Timeline.load(tmp_path / "timeline.json", through_round=2)
    assert [event["args"]["round"] for event in kept.events] == [0, 1, 2]
