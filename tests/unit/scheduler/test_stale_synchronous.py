"""The SSP engine of the scheduler in one process, against simulated workers of different speeds.

A fake transport (under the real protocol link) plays the workers: each dispatched update finishes after its
worker's duration (simulated time) and returns ``base + step``, so every merge
can be checked by hand. The model and the evaluation are real (a tiny Keras model).
"""

from __future__ import annotations

import csv
import heapq
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from mpi_trainer.comm.protocol import JobPlan, Report, SchedulerLink, StopOrder, UpdateOrder
from mpi_trainer.comm.transport import Received
from mpi_trainer.config import Config, config_from_dict
from mpi_trainer.data.sources import Dataset, TrainRows
from mpi_trainer.errors import WorkerFailure
from mpi_trainer.launch.roles import pick_roles
from mpi_trainer.persistence.resume import ResumeState, load_resume_state
from mpi_trainer.scheduler import LbfgsScheduler, StaleSynchronousEngine, SynchronousEngine


@dataclass
class FakeWorkers:
    """A Transport stand-in: rank 0 talks to simulated workers with fixed update durations."""

    durations: dict[int, float]
    val_accuracy: dict = field(default_factory=dict)  # by worker, or by (worker, clock) for one update
    step: float = 0.01
    nan_from: dict = field(default_factory=dict)  # worker -> first clock whose weights come back NaN
    hung: set = field(default_factory=set)  # workers whose updates never come back
    now: float = 0.0
    pending: list = field(default_factory=list)
    results: dict[int, np.ndarray] = field(default_factory=dict)
    orders: list = field(default_factory=list)
    stopped: set = field(default_factory=set)
    last_order: dict = field(default_factory=dict)
    wait_wall_seconds: float = 0.0
    wait_cpu_seconds: float = 0.0
    size: int = 0
    host: str = "simulated"

    def __post_init__(self) -> None:
        self.size = len(self.durations) + 1

    def take_bytes(self) -> int:
        return 0

    def send_object(self, order, dest: int, tag: int) -> int:
        self.orders.append((dest, type(order)))
        if isinstance(order, StopOrder):
            self.stopped.add(dest)
        self.last_order[dest] = order
        return 64

    def send_array(self, buf: np.ndarray, dest: int, tag: int = 0, timeout: float | None = None) -> None:
        assert timeout is not None, "the scheduler would wait forever for a worker that takes nothing"
        assert isinstance(self.last_order[dest], UpdateOrder)
        clock = self.last_order[dest].clock
        self.results[dest] = buf + np.float32(self.step * dest)  # each worker learns its own step
        if clock >= self.nan_from.get(dest, clock + 1):
            self.results[dest][:] = np.nan
        if dest not in self.hung:
            heapq.heappush(self.pending, (self.now + self.durations[dest], dest, clock))

    def recv_object(self, source: int = -1, tag: int = 0, timeout: float | None = None,
                    due: float | None = None) -> Received:
        if not self.pending:
            if timeout is None:
                raise AssertionError("the scheduler would wait forever for a hung worker")
            raise TimeoutError
        self.now, worker, clock = heapq.heappop(self.pending)
        report = Report(worker, clock, 10 * worker, 0.5, 0.5, self.durations[worker],
                        val_accuracy=self.val_accuracy.get((worker, clock), self.val_accuracy.get(worker, 0.5)),
                        val_loss=0.1)
        return Received(report, worker, 100)

    def recv_array(self, buf: np.ndarray, source: int = -1, tag: int = 0,
                   timeout: float | None = None) -> Received:
        buf[:] = self.results.pop(source)
        return Received(buf, source, buf.nbytes)


def make_scheduler(tmp_path: Path, transport: FakeWorkers, resume: ResumeState | None = None,
                   engine: type = StaleSynchronousEngine, **sections) -> StaleSynchronousEngine:
    import keras

    keras.utils.set_random_seed(0)
    table = {"train": {"epochs": 6}, "log": {"verbosity": 0}, **sections}
    cfg = config_from_dict(table)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 3)).astype("float32"), rng.integers(0, 2, 40)
    train = TrainRows("toy", x, y, np.arange(len(x)))
    dataset = Dataset("toy", train, x[:0], y[:0], x, y, 2, (3,))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    workers = transport.size - 1
    total = sum(10 * w for w in range(1, workers + 1))
    plan = JobPlan(cfg.to_dict(), None, [(0, 1)] * workers, 0, total)
    return engine(SchedulerLink(transport), cfg, dataset, model, plan, tmp_path, resume=resume)


def read_updates(tmp_path: Path) -> list[dict[str, str]]:
    with (tmp_path / "updates.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("bound", [1, 2])
def test_engine_keeps_staleness_within_the_bound_and_merges_deltas(tmp_path, bound):
    transport = FakeWorkers({1: 1.0, 2: 1.0, 3: 3.0})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": bound, "method": "weighted"})
    start = scheduler.weights.copy()
    summary = scheduler.run()
    updates = read_updates(tmp_path)
    assert summary["rounds_completed"] == 6 and len(updates) == 6 * 3
    assert max(int(u["staleness"]) for u in updates) == bound
    # weighted shares n_w / N = 10w / 60; each merged delta is step * w, whatever its staleness
    expected = sum(float(u["share"]) * 0.01 * int(u["worker"]) for u in updates)
    np.testing.assert_allclose(scheduler.weights - start, expected, atol=1e-5)
    fast = sum(1 for u in updates if u["worker"] == "1")
    assert fast > sum(1 for u in updates if u["worker"] == "3")
    assert transport.stopped == {1, 2, 3} and not transport.pending  # nobody left mid-update


def test_a_fast_workers_clock_ends_at_most_s_past_the_last_round(tmp_path):
    # The data a worker trains on follows its clock, so scatter placement sends draws up to this clock.
    epochs, bound = 4, 2
    make_scheduler(tmp_path, FakeWorkers({1: 1.0, 2: 5.0}), aggregation={"ssp": bound},
                   train={"epochs": epochs}).run()
    clocks = [int(u["clock"]) for u in read_updates(tmp_path)]
    assert epochs <= max(clocks) <= epochs - 1 + bound  # past the last round, within the bound


def test_early_stop_takes_in_the_updates_in_flight_before_releasing_workers(tmp_path):
    transport = FakeWorkers({1: 1.0, 2: 2.0})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": 1},
                               early_stopping={"patience": 1, "min_delta": 1.0})
    summary = scheduler.run()
    assert summary["stop_reason"] == "early_stopping" and summary["rounds_completed"] == 2
    assert not transport.pending and transport.stopped == {1, 2}
    assert set(transport.orders[-2:]) == {(1, StopOrder), (2, StopOrder)}


def test_best_under_ssp_elects_the_highest_validation_accuracy_per_window(tmp_path):
    transport = FakeWorkers({1: 1.0, 2: 1.5}, val_accuracy={1: 0.6, 2: 0.9})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": 1, "method": "best"},
                               train={"epochs": 3})
    scheduler.run()
    rows = list(csv.DictReader((tmp_path / "rounds.csv").open(newline="")))
    for row in rows:
        own = [u for u in read_updates(tmp_path) if u["round"] == row["round"]]
        workers = {u["worker"] for u in own}
        assert row["winner"] == ("2" if "2" in workers else "1")


def test_best_round_row_reports_the_winning_update_when_its_worker_sent_two(tmp_path):
    # worker 1 is five times faster: with s = 1 its clocks 0 and 1 fill the first window, and clock 1 wins
    transport = FakeWorkers({1: 1.0, 2: 5.0}, val_accuracy={(1, 0): 0.6, (1, 1): 0.8})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": 1, "method": "best"},
                               train={"epochs": 2})
    scheduler.run()
    first = [u for u in read_updates(tmp_path) if u["round"] == "0"]
    assert [(u["worker"], u["clock"], float(u["val_accuracy"])) for u in first] == [("1", "0", 0.6), ("1", "1", 0.8)]
    row = next(csv.DictReader((tmp_path / "rounds.csv").open(newline="")))
    assert row["winner"] == "1" and float(row["val_accuracy"]) == pytest.approx(0.8)


def test_resume_goes_on_from_the_checkpoint_and_logs_every_round_and_update_once(tmp_path):
    sections = {"aggregation": {"ssp": 1, "method": "weighted"}, "checkpoint": {"every": 1}}
    make_scheduler(tmp_path, FakeWorkers({1: 1.0, 2: 2.0}), train={"epochs": 3}, **sections).run()
    with (tmp_path / "updates.csv").open("a", newline="") as handle:  # a crash in round 3, after one update
        csv.writer(handle).writerow([6, 3, 1, 3, 5, 7, 0, 1, 0.25, 10, 1.0, 0.5, "nan", "nan", 9.0])
    transport = FakeWorkers({1: 1.0, 2: 2.0})
    cfg = config_from_dict({"train": {"epochs": 6}, "log": {"verbosity": 0}, **sections})
    resume = load_resume_state(tmp_path, cfg.to_dict())
    summary = make_scheduler(tmp_path, transport, resume, train={"epochs": 6}, **sections).run()
    rounds = list(csv.DictReader((tmp_path / "rounds.csv").open(newline="")))
    updates = read_updates(tmp_path)
    assert [r["round"] for r in rounds] == [str(r) for r in range(6)] and summary["rounds_completed"] == 6
    assert [int(u["update"]) for u in updates] == list(range(12))  # numbered on, the torn round's row gone
    assert [sum(1 for u in updates if u["round"] == str(r)) for r in range(6)] == [2] * 6
    resumed = [u for u in updates if int(u["round"]) >= 3]
    assert min(int(u["clock"]) for u in resumed) == 3  # clocks (and the workers' data draws) go on
    assert max(int(u["staleness"]) for u in resumed) <= 1 and transport.stopped == {1, 2}


def test_non_finite_merged_weights_stop_the_run_with_the_best_weights_and_nobody_left_waiting(tmp_path):
    transport = FakeWorkers({1: 1.0, 2: 1.5}, nan_from={2: 2})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": 1})
    summary = scheduler.run()
    poisoned = next(u for u in read_updates(tmp_path) if (u["worker"], u["clock"]) == ("2", "2"))
    # the round holding the first NaN update is not recorded; the rounds before it are
    assert summary["stop_reason"] == "nan" and summary["rounds_completed"] == int(poisoned["round"]) >= 2
    assert np.all(np.isfinite(scheduler.weights))  # the best round's weights are kept
    assert summary["final_round"] == summary["best_round"] < int(poisoned["round"])
    assert transport.stopped == {1, 2} and not transport.pending


def test_a_hung_worker_ends_the_run_through_the_watchdog_naming_it(tmp_path):
    transport = FakeWorkers({1: 1.0, 2: 1.0}, hung={2})
    scheduler = make_scheduler(tmp_path, transport, aggregation={"ssp": 2}, watchdog={"worker_timeout": 5.0})
    with pytest.raises(WorkerFailure, match="worker rank 2 on host simulated did not return an update"):
        scheduler.run()


def test_a_worker_that_does_not_take_its_moved_rows_is_named_by_the_watchdog(tmp_path):
    # The synchronous engine's row hand-over after a re-cut under scatter placement.
    transport = FakeWorkers({1: 1.0, 2: 1.0})
    scheduler = make_scheduler(tmp_path, transport, engine=SynchronousEngine, watchdog={"worker_timeout": 5.0})

    def never_taken(array, dest, tag=0, timeout=None):
        assert timeout == 5.0
        raise TimeoutError

    transport.send_large_array = never_taken
    scheduler.moved = {2: np.array([3, 7])}
    with pytest.raises(WorkerFailure, match="worker rank 2 on host simulated did not take its training rows "
                                           "for round 4 within watchdog.worker_timeout=5 s"):
        scheduler.send_moved(2, 4)


def test_one_factory_picks_the_engine_and_the_worker_class():
    from mpi_trainer.worker import Worker
    from mpi_trainer.worker.lbfgs import LbfgsWorker

    assert pick_roles(Config()).engine is SynchronousEngine
    assert pick_roles(config_from_dict({"aggregation": {"ssp": 1}})).engine is StaleSynchronousEngine
    assert pick_roles(config_from_dict({"debug": {"async_engine": True}})).engine is StaleSynchronousEngine
    assert pick_roles(Config()).worker is Worker
    lbfgs = pick_roles(config_from_dict({"model": {"name": "softmax_regression", "optimizer": "lbfgs"}}))
    assert (lbfgs.engine, lbfgs.worker) == (LbfgsScheduler, LbfgsWorker)
