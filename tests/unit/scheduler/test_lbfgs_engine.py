"""The L-BFGS engine on rank 0 with its workers in this process: records, early stopping, checkpoints, resume."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import keras
import numpy as np
import pytest
from lbfgs_reference import scipy_losses, softmax_regression_objective
from local_job import run_local_job

from mpi_trainer.algorithms.lbfgs import EVALUATE, PREEMPTED, STOP
from mpi_trainer.comm.protocol import JobPlan, SchedulerLink, WorkerLink
from mpi_trainer.config import config_from_dict
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import WorkerFailure
from mpi_trainer.models import build_model
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.persistence.resume import load_resume_state
from mpi_trainer.persistence.run_files import read_rounds
from mpi_trainer.persistence.run_record import RunContext
from mpi_trainer.scheduler.lbfgs import LbfgsScheduler
from mpi_trainer.worker.lbfgs import LbfgsWorker

WORKERS = 2
STANDARD_COLUMNS = ["round", "wall_seconds", "train_seconds_max", "train_seconds_min", "comm_seconds",
                    "aggregate_seconds", "eval_seconds", "bytes", "test_loss", "test_accuracy", "max_staleness"]


class RankView:
    """What a worker asks of its transport outside the collectives."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size, self.workers = rank, size, size - 1


class InProcessTransport:
    """Rank 0's transport, with the workers' side of each collective run here."""

    def __init__(self, workers: list[LbfgsWorker], stall: bool = False) -> None:
        self.rank, self.size, self.host = 0, len(workers) + 1, "test"
        self.workers = len(workers)
        self.peers, self.stall = workers, stall
        self.request: np.ndarray | None = None
        self.bytes_sent = 0
        self.wait_wall_seconds = self.wait_cpu_seconds = 0.0

    def take_bytes(self) -> int:
        sent, self.bytes_sent = self.bytes_sent, 0
        return sent

    def broadcast(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        if self.stall:
            raise TimeoutError("no worker took the broadcast")
        self.request = buf.copy()
        self.bytes_sent += buf.nbytes * self.workers

    def reduce_sum(self, buf: np.ndarray, root: int = 0, timeout: float | None = None) -> None:
        assert self.request is not None and self.request[0] == EVALUATE
        for worker in self.peers:
            part = worker.layout.contribution()
            worker.contribute(self.request[1:], part)
            buf += part


def make_engine(run_dir: Path, overrides: dict, resume: bool = False, stall: bool = False,
                preemption: Preemption | None = None) -> LbfgsScheduler:
    table = {"data": {"source": "digits", "validation_size": 0.0},
             "model": {"name": "softmax_regression", "optimizer": "lbfgs"}, **overrides}
    cfg = config_from_dict(table)
    dataset = load_dataset(cfg.data, cfg.train.seed)
    keras.utils.set_random_seed(cfg.train.seed)
    model, spec = build_model(cfg.model, dataset.input_shape, dataset.num_outputs)
    bounds = block_bounds(dataset.num_train, WORKERS)
    plan = JobPlan(cfg.to_dict(), spec, bounds, cfg.train.seed, dataset.num_train)
    x, y = dataset.x_train, dataset.y_train
    workers = [LbfgsWorker(WorkerLink(RankView(rank, WORKERS + 1)), plan, cfg, x[start:end], y[start:end])
               for rank, (start, end) in enumerate(bounds, start=1)]
    state = load_resume_state(run_dir, cfg.to_dict()) if resume else None
    run_dir.mkdir(exist_ok=True)
    return LbfgsScheduler(SchedulerLink(InProcessTransport(workers, stall)), cfg, dataset, model, plan, run_dir,
                          resume=state, context=RunContext(preemption=preemption))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lbfgs") / "run"
    engine = make_engine(run_dir, {"train": {"epochs": 4}, "checkpoint": {"every": 2}})
    x0 = engine.vector.read()
    summary = engine.run()
    dataset = engine.dataset
    reference = scipy_losses(softmax_regression_objective(dataset.x_train, dataset.y_train, dataset.num_outputs),
                             x0, 4)
    return run_dir, summary, engine, reference


def test_one_row_per_iteration_with_the_losses_scipy_finds(finished_run):
    run_dir, summary, _, reference = finished_run
    rows = read_rounds(run_dir / "rounds.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3]
    assert set(STANDARD_COLUMNS + ["function_evaluations", "train_loss"]) <= set(rows[0])
    np.testing.assert_allclose([float(r["train_loss"]) for r in rows], reference, rtol=1e-5)
    evaluations = [int(r["function_evaluations"]) for r in rows]
    assert evaluations[0] >= 2 and evaluations == sorted(evaluations)
    assert all(float(r["train_seconds_max"]) >= float(r["train_seconds_min"]) > 0 for r in rows)
    assert float(rows[-1]["test_accuracy"]) > 0.8


def test_bytes_are_one_broadcast_and_one_reduction_per_evaluation(finished_run):
    run_dir, summary, engine, _ = finished_run
    per_evaluation = WORKERS * 8 * ((1 + engine.vector.size) + (2 + WORKERS + engine.vector.size))
    rows = read_rounds(run_dir / "rounds.csv")
    evaluations = [0] + [int(r["function_evaluations"]) for r in rows]
    for row, before, after in zip(rows, evaluations, evaluations[1:]):
        assert int(row["bytes"]) == (after - before) * per_evaluation


def test_summary_has_the_standard_keys_and_says_why_it_stopped(finished_run):
    run_dir, summary, _, _ = finished_run
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("rounds_completed", "final_test_accuracy", "best_test_accuracy", "wall_seconds", "traffic_bytes",
                "stop_reason", "workers", "aggregation", "ssp"):
        assert key in on_disk, key
    assert on_disk["rounds_completed"] == 4 and on_disk["stop_reason"] == "epochs"
    assert on_disk["optimizer"] == "lbfgs" and on_disk["workers"] == WORKERS
    assert on_disk["function_evaluations"] == int(read_rounds(run_dir / "rounds.csv")[-1]["function_evaluations"])


def test_checkpoint_and_final_weights_hold_the_last_iterate(finished_run):
    run_dir, _, engine, _ = finished_run
    with h5py.File(run_dir / "checkpoint.h5") as handle:
        weights = handle["weights"][()]
        meta = json.loads(handle.attrs["meta"])
    assert meta["round"] == 3 and meta["optimizer"] == "lbfgs"
    assert (run_dir / "checkpoint.h5.bak").exists()  # the one written after iteration 1
    np.testing.assert_array_equal(weights, engine.codec.flatten(engine.model.get_weights()))
    engine.model.load_weights(run_dir / "final.weights.h5")
    np.testing.assert_array_equal(engine.codec.flatten(engine.model.get_weights()), weights)


def test_resume_continues_the_numbering_and_the_evaluation_count(finished_run, tmp_path):
    run_dir, summary, _, _ = finished_run
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("rounds.csv", "checkpoint.h5", "checkpoint.h5.bak", "summary.json"):
        (copy / name).write_bytes((run_dir / name).read_bytes())
    resumed = make_engine(copy, {"train": {"epochs": 6}, "checkpoint": {"every": 2}}, resume=True).run()
    rows = read_rounds(copy / "rounds.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3, 4, 5]
    assert int(rows[4]["function_evaluations"]) > summary["function_evaluations"]
    assert float(rows[5]["train_loss"]) < float(rows[3]["train_loss"])
    assert resumed["resumed_after_round"] == 3 and resumed["rounds_completed"] == 6


def test_early_stopping_keeps_the_best_iterate(tmp_path):
    engine = make_engine(tmp_path / "run", {"train": {"epochs": 10},
                                             "early_stopping": {"patience": 1, "min_delta": 10.0,
                                                                "monitor": "test_loss"}})
    summary = engine.run()
    assert summary["stop_reason"] == "early_stopping"
    assert summary["rounds_completed"] == 2 and summary["final_round"] == 0
    best = engine.recorder.best.read()
    np.testing.assert_array_equal(engine.codec.flatten(engine.model.get_weights()), best)


def test_a_preemption_checkpoints_the_iterate_tells_the_workers_and_resumes_after_it(tmp_path):
    run_dir = tmp_path / "run"
    watch = Preemption()
    engine = make_engine(run_dir, {"train": {"epochs": 5}}, preemption=watch)
    record = engine.record

    def record_then_signal(row: dict) -> None:  # the signal arrives while iteration 1 is recorded
        record(row)
        if int(row["round"]) == 1:
            watch.request("SIGTERM")

    engine.record = record_then_signal
    try:
        summary = engine.run()
    finally:
        watch.uninstall()
    assert summary["stop_reason"] == "preempted" and summary["completed"] is False
    assert [int(r["round"]) for r in read_rounds(run_dir / "rounds.csv")] == [0, 1]
    with h5py.File(run_dir / "checkpoint.h5") as handle:
        assert json.loads(handle.attrs["meta"])["round"] == 1  # checkpoint.every = 0: written for the signal
    assert not (run_dir / "final.weights.h5").exists()
    assert engine.transport.request[0] == PREEMPTED  # the workers' stop request says why: they exit 75 too
    resumed = make_engine(run_dir, {"train": {"epochs": 5}}, resume=True).run()
    assert [int(r["round"]) for r in read_rounds(run_dir / "rounds.csv")] == [0, 1, 2, 3, 4]
    assert resumed["stop_reason"] == "epochs" and resumed["resumed_after_round"] == 1


@pytest.mark.parametrize("flag, preempted", [(STOP, False), (PREEMPTED, True)])
def test_a_worker_leaves_on_the_stop_request_knowing_whether_the_job_was_preempted(tmp_path, flag, preempted):
    worker = make_engine(tmp_path / "run", {}).transport.peers[0]

    class Requests:  # the initial weights (left as they come), then the stop request
        received = 0

        def recv_broadcast(self, buffer):
            self.received += 1
            if self.received == 2:
                buffer[0] = flag

    worker.link = Requests()
    worker.run()
    assert worker.preempted is preempted and worker.evaluations == 0


def test_workers_that_never_answer_end_the_job_with_a_watchdog_message(tmp_path):
    engine = make_engine(tmp_path / "run", {"watchdog": {"worker_timeout": 1.0}}, stall=True)
    with pytest.raises(WorkerFailure, match="did not take the initial weights within watchdog.worker_timeout=1 s"):
        engine.run()


def test_summary_and_rows_have_the_shape_every_engine_writes(finished_run, tmp_path):
    """A report, the Python API or an outside check reads one record whichever engine ran."""
    run_dir, summary, _, _ = finished_run
    job = run_local_job(tmp_path / "sgd", workers=WORKERS, train={"epochs": 1})
    sgd = json.loads((job.run_dir / "summary.json").read_text())
    lbfgs = json.loads((run_dir / "summary.json").read_text())
    assert sorted(lbfgs) == sorted(sgd)
    assert sgd["function_evaluations"] is None and sgd["optimizer"] == "adam"
    assert lbfgs["learning_rate"] is None and lbfgs["outer_optimizer"] == "none"
    sgd_columns = list(read_rounds(job.run_dir / "rounds.csv")[0])
    lbfgs_columns = list(read_rounds(run_dir / "rounds.csv")[0])
    assert lbfgs_columns == sgd_columns + ["function_evaluations", "gradient_norm"]


def _scalar_tags(run_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _checkpoint_round(path: Path) -> int:
    with h5py.File(path) as handle:
        return json.loads(handle.attrs["meta"])["round"]


def test_the_run_directory_is_written_as_the_synchronous_engine_writes_it(tmp_path):
    """One writer for every engine: the same summary keys and rows, checkpoints by time alone
    (``checkpoint.every_seconds``, ``every = 0``), TensorBoard events and the timeline."""
    sections = {"train": {"epochs": 3}, "checkpoint": {"every": 0, "every_seconds": 1e-6},
                "log": {"tensorboard": True, "timeline": True}}
    lbfgs_dir = tmp_path / "lbfgs"
    make_engine(lbfgs_dir, sections).run()
    sgd_dir = run_local_job(tmp_path / "sgd", workers=WORKERS, **sections).run_dir
    lbfgs, sgd = (json.loads((run_dir / "summary.json").read_text()) for run_dir in (lbfgs_dir, sgd_dir))
    assert sorted(lbfgs) == sorted(sgd) and lbfgs["rounds_completed"] == sgd["rounds_completed"] == 3
    lbfgs_rows, sgd_rows = (read_rounds(run_dir / "rounds.csv") for run_dir in (lbfgs_dir, sgd_dir))
    assert list(lbfgs_rows[0]) == list(sgd_rows[0]) + ["function_evaluations", "gradient_norm"]
    for run_dir in (lbfgs_dir, sgd_dir):
        # a checkpoint after every round, by time alone: the latest holds round 2, its backup round 1
        assert _checkpoint_round(run_dir / "checkpoint.h5") == 2, run_dir
        assert _checkpoint_round(run_dir / "checkpoint.h5.bak") == 1, run_dir
        trace = json.loads((run_dir / "timeline.json").read_text())
        rank_0 = {(e["name"], e["args"]["round"]) for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == 0}
        assert {("evaluate", 2), ("checkpoint", 2)} <= rank_0, run_dir
    lbfgs_tags, sgd_tags = _scalar_tags(lbfgs_dir), _scalar_tags(sgd_dir)
    shared = {"metrics/test_accuracy", "metrics/test_loss", "metrics/train_loss", "time/wall_seconds",
              "time/eval_seconds", "traffic/bytes", "run/max_staleness", "workers/train_seconds/rank_1",
              "workers/train_seconds/rank_2"}
    assert {"lbfgs": shared - set(lbfgs_tags), "sgd": shared - set(sgd_tags)} == {"lbfgs": set(), "sgd": set()}
    assert all(lbfgs_tags[tag] == sgd_tags[tag] == [0, 1, 2] for tag in shared)
