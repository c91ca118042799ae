"""Every rank's phases per round as a Chrome trace (``timeline.json``, log.timeline = true).

Open the file in chrome://tracing or https://ui.perfetto.dev: one row per rank
(pid = rank), one box per phase (train, send, wait, aggregate, evaluate,
checkpoint) with its round. Gaps in a rank's row are time it spent idle.
Times are wall-clock (``time.time()``) microseconds, so ranks on one host line
up exactly; across hosts they are as close as the hosts' clocks.

Workers send their phases with their reports; rank 0 adds them, and its own, to a :class:`Timeline`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.run_files import write_atomic

PHASES = ("train", "send", "wait", "aggregate", "evaluate", "checkpoint")

# (phase, round, start, end); start and end in time.time() seconds.
Phase = tuple[str, int, float, float]


class Timeline:
    """Chrome trace "X" (complete) events, one per phase of one rank in one round."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.ranks: dict[int, str] = {}

    def add(self, rank: int, phase: str, start: float, end: float, round_index: int) -> None:
        if phase not in PHASES:
            raise ValueError(f"Unknown timeline phase. Received: phase={phase!r}; expected one of {list(PHASES)}")
        self.events.append({"name": phase, "cat": "round", "ph": "X", "pid": int(rank), "tid": 0,
                            "ts": round(start * 1e6, 1), "dur": round(max(0.0, end - start) * 1e6, 1),
                            "args": {"round": int(round_index)}})

    def add_phases(self, rank: int, phases: list[Phase]) -> None:
        for phase, round_index, start, end in phases:
            self.add(rank, phase, start, end, round_index)

    def name_rank(self, rank: int, label: str) -> None:
        """The row title chrome://tracing shows for this rank."""
        self.ranks[int(rank)] = label

    def to_json(self) -> dict[str, Any]:
        names = [{"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": label}}
                 for rank, label in sorted(self.ranks.items())]
        order = [{"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
                 for rank in sorted(self.ranks)]
        events = sorted(self.events, key=lambda e: (e["ts"], e["pid"]))
        return {"traceEvents": names + order + events, "displayTimeUnit": "ms"}

    def write(self, path: Path) -> None:
        """Replace ``path`` atomically: a reader sees the previous or the new trace, whole."""
        write_atomic(Path(path), json.dumps(self.to_json(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path, through_round: int | None = None) -> Timeline:
        """The events of an earlier attempt (a resumed run goes on adding to them), but for rounds
        after ``through_round``: the resumed run runs those again."""
        timeline = cls()
        try:
            trace = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return timeline
        except (OSError, ValueError) as exc:
            get_logger().warning("%s is unreadable (%s); the timeline starts afresh", path, exc)
            return timeline
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "X":
                if through_round is None or int(event.get("args", {}).get("round", -1)) <= through_round:
                    timeline.events.append(event)
            elif event.get("name") == "process_name":
                timeline.ranks[int(event["pid"])] = event["args"]["name"]
        return timeline
