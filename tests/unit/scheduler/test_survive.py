"""fault.survive in one process: a worker lost mid-round, the survivors shrink, re-plan and redo the round."""

from __future__ import annotations

import json

import numpy as np
import pytest
from local_job import build_local_job, run_local_job

from mpi_trainer.config import config_from_dict
from mpi_trainer.errors import ConfigError, RankLost, WorkerFailure
from mpi_trainer.persistence.checkpoint import load_checkpoint
from mpi_trainer.persistence.run_files import CHECKPOINT_NAME, read_rounds
from mpi_trainer.scheduler.evaluation import Evaluator
from mpi_trainer.worker import Worker

# plain averaging: the global model is the survivors' mean (the outer step with a loss: test_outer_rounds)
PLAIN = {"outer_optimizer": "none"}


def survive(crash_rank: int = 2, crash_round: int = 1, phase: str = "contribute", **fault: object) -> dict:
    return {"fault": {"survive": True, **fault},
            "debug": {"crash_rank": crash_rank, "crash_round": crash_round, "crash_phase": phase}}


def last_trained(job, round_index: int) -> list[tuple]:
    """The surviving workers' last training of ``round_index`` (a redone round was trained twice)."""
    team = [w for w in job.workers if w.link.transport.world_rank != 2]
    return [[t for t in w.trained if t[0].round == round_index][-1] for w in team]


@pytest.mark.parametrize("phase", ["train", "contribute"])
@pytest.mark.parametrize("method", ["average", "weighted", "best"])
def test_a_lost_worker_leaves_the_survivors_to_redo_the_round(tmp_path, method, phase):
    job = run_local_job(tmp_path, workers=3, train={"epochs": 3}, aggregation={"method": method, **PLAIN},
                        **survive(phase=phase))
    rows = job.rounds()
    assert [int(r["round"]) for r in rows] == [0, 1, 2]  # every round once, the redone one included
    assert [int(r["workers"]) for r in rows] == [3, 2, 2]
    assert job.engine.workers == [1, 2] and len(job.engine.plan.block_bounds) == 2
    assert job.summary["lost_workers"] == [{"rank": 2, "host": "local", "where": "round 1"}]
    # the survivors' re-planned blocks cover the training set, and each trained its own
    survivors = [w for w in job.workers if w.link.transport.world_rank != 2]
    assert [w.rank for w in survivors] == [1, 2]
    assert sum(len(w.data.fixed) for w in survivors) == job.engine.plan.num_train
    assert len(np.unique(np.concatenate([w.data.fixed for w in survivors]))) == job.engine.plan.num_train
    # the global model is the survivors' round 2 alone: nothing of the lost worker's partial round
    trained = last_trained(job, 2)
    if method == "best":
        winner = int(rows[-1]["winner"])
        np.testing.assert_array_equal(job.engine.weights, trained[winner - 1][1])
    else:
        samples = np.array([r.samples for r, _ in trained], dtype=np.float64)
        shares = samples / samples.sum() if method == "weighted" else np.full(2, 0.5)
        expected = sum(share * local for share, (_, local) in zip(shares, trained))
        np.testing.assert_allclose(job.engine.weights, expected, atol=1e-5)


def test_the_redone_round_starts_from_the_rounds_global_weights(tmp_path):
    job = run_local_job(tmp_path, workers=3, train={"epochs": 2}, aggregation=PLAIN, **survive(crash_round=1))
    after_round_0 = np.mean([local for _, local in job.trained(0)], axis=0)
    # both survivors trained round 1 twice, each time from round 0's global weights
    for worker in (w for w in job.workers if w.link.transport.world_rank != 2):
        starts = [weights for weights, (report, _) in zip(worker.started_from, worker.trained) if report.round == 1]
        assert len(starts) == 2
        for weights in starts:
            np.testing.assert_allclose(weights, after_round_0, atol=1e-5)
    np.testing.assert_allclose(job.engine.weights, np.mean([local for _, local in last_trained(job, 1)], axis=0),
                               atol=1e-5)


@pytest.mark.parametrize("crash_round", [0, 1])
def test_with_evaluation_on_workers_the_scheduler_scores_after_a_loss(tmp_path, crash_round):
    job = run_local_job(tmp_path, workers=3, train={"epochs": 3}, evaluation={"where": "workers"}, aggregation=PLAIN,
                        **survive(crash_round=crash_round))
    rows = job.rounds()
    assert [int(r["round"]) for r in rows] == [0, 1, 2] and int(rows[-1]["workers"]) == 2
    # every round is scored, before the loss by the workers' shards and after it by the scheduler
    assert all(0.0 < float(r["test_accuracy"]) <= 1.0 for r in rows)
    evaluator = job.engine.evaluator
    assert not evaluator.on_workers and evaluator.moved
    scored_by_workers = {report_round for w in job.workers for report_round in w.scored_rounds}
    assert scored_by_workers == set(range(crash_round))  # none after the loss: their shards no longer cover the split
    if crash_round == 1:  # the redone round starts from round 0's global weights, broadcast again after the loss
        after_round_0 = np.mean([local for _, local in job.trained(0)], axis=0)
        for worker in (w for w in job.workers if w.link.transport.world_rank != 2):
            for weights, (report, _) in zip(worker.started_from, worker.trained):
                if report.round == 1:
                    np.testing.assert_allclose(weights, after_round_0, atol=1e-5)
    # the last row's scores are the final weights' on the whole test split
    plain = Evaluator(job.engine.cfg, job.engine.dataset, job.engine.model, job.engine.codec)
    scores, _ = plain.evaluate(job.engine.weights)
    assert float(rows[-1]["test_accuracy"]) == pytest.approx(scores["test_accuracy"])


@pytest.mark.parametrize("phase, crash_round", [("train", 1), ("contribute", 1), ("train", 2)])
def test_with_overlapped_evaluation_the_round_under_way_is_redone_once(tmp_path, phase, crash_round):
    # round k + 1 is handed out before round k is scored: a loss in it surfaces in its own collection
    job = run_local_job(tmp_path, workers=3, train={"epochs": 4, "overlap_eval": True}, aggregation=PLAIN,
                        checkpoint={"every_seconds": 0}, **survive(crash_round=crash_round, phase=phase))
    rows = job.rounds()
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3]
    assert [int(r["workers"]) for r in rows] == [3] * crash_round + [2] * (4 - crash_round)
    np.testing.assert_allclose(job.engine.weights, np.mean([local for _, local in last_trained(job, 3)], axis=0),
                               atol=1e-5)
    after = np.mean([local for _, local in job.trained(crash_round - 1)], axis=0)  # all 3 trained it
    for worker in (w for w in job.workers if w.link.transport.world_rank != 2):
        starts = [weights for weights, (report, _) in zip(worker.started_from, worker.trained)
                  if report.round == crash_round]
        for weights in starts:  # the redone round starts from the global weights it started from before
            np.testing.assert_allclose(weights, after, atol=1e-5)


@pytest.mark.parametrize("phase, placement, method", [
    ("train", "shared", "average"), ("contribute", "shared", "weighted"), ("train", "scatter", "average"),
    ("contribute", "shared", "best"),
])
def test_under_ssp_the_survivors_carry_on_and_every_round_is_recorded_once(tmp_path, phase, placement, method):
    job = run_local_job(tmp_path, workers=3, train={"epochs": 4}, aggregation={"ssp": 1, "method": method},
                        data={"placement": placement}, **survive(crash_round=1, phase=phase))
    rows = job.rounds()
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3]
    workers = [int(r["workers"]) for r in rows]  # under SSP the loss may come while round 0 still gathers
    assert workers == sorted(workers, reverse=True) and workers[-1] == 2 and workers[0] in (2, 3)
    assert job.summary["lost_workers"][0]["rank"] == 2 and job.engine.workers == [1, 2]
    survivors = [w for w in job.workers if w.link.transport.world_rank != 2]
    held = np.concatenate([w.data.fixed for w in survivors])
    assert len(np.unique(held)) == job.engine.plan.num_train  # the survivors' blocks cover every row
    assert not job.engine.in_flight and float(rows[-1]["test_accuracy"]) > 0.5
    # the global model holds whole updates only: each merged update is one the survivors reported
    updates = read_rounds(tmp_path / "updates.csv")
    assert all(int(u["worker"]) in (1, 2, 3) for u in updates)
    assert sum(1 for u in updates if int(u["round"]) >= 2) == 2 * 2  # rounds after the loss: 2 workers each


def test_scatter_sends_the_lost_workers_rows_to_the_survivors(tmp_path):
    job = run_local_job(tmp_path, workers=3, train={"epochs": 2}, data={"placement": "scatter"},
                        **survive(crash_round=0, phase="train"))
    assert [int(r["workers"]) for r in job.rounds()] == [2, 2]
    survivors = [w for w in job.workers if w.link.transport.world_rank != 2]
    held = np.concatenate([w.data.fixed for w in survivors])
    assert len(np.unique(held)) == job.engine.plan.num_train  # every row is trained on by a survivor


def test_a_worker_lost_while_the_checkpoint_gathers_states_leaves_the_survivors_states_in_it(tmp_path, monkeypatch):
    sent = Worker.send_optimizer

    def lost_when_asked(worker, order):  # starting rank 2 dies when asked for its state after round 0
        if worker.link.transport.world_rank == 2:
            worker.link.crash()
        sent(worker, order)

    monkeypatch.setattr(Worker, "send_optimizer", lost_when_asked)
    job = run_local_job(tmp_path, workers=3, train={"epochs": 2}, aggregation=PLAIN, checkpoint={"every": 1},
                        fault={"survive": True})
    assert [int(r["workers"]) for r in job.rounds()] == [3, 2]
    assert job.summary["lost_workers"] == [{"rank": 2, "host": "local",
                                            "where": "the optimizer state gathered after round 0"}]
    arrays, meta = load_checkpoint(tmp_path / CHECKPOINT_NAME)  # written again, with the survivors' states
    assert meta["round"] == 1 and meta["workers"] == 2
    assert sorted(name for name in arrays if name.startswith("optimizer_rank_")) == ["optimizer_rank_1",
                                                                                   "optimizer_rank_2"]
    assert not (tmp_path / (CHECKPOINT_NAME + ".tmp")).exists()


def test_below_min_workers_the_job_checkpoints_and_fails(tmp_path):
    engine, team, world = build_local_job(tmp_path, workers=2, train={"epochs": 4},
                                          **survive(crash_rank=1, crash_round=2, min_workers=2))
    with pytest.raises(WorkerFailure, match="1 workers left, fewer than fault.min_workers=2"):
        world.run({0: engine.run, **{w.rank: w.run for w in team}})
    _, meta = load_checkpoint(tmp_path / CHECKPOINT_NAME)
    assert meta["round"] == 1  # the last round recorded before the loss
    assert [int(r["round"]) for r in engine.rounds] == [0, 1]


def test_without_fault_survive_a_lost_worker_ends_the_job(tmp_path):
    engine, team, world = build_local_job(tmp_path, workers=2, train={"epochs": 3},
                                          debug={"crash_rank": 1, "crash_round": 1})
    with pytest.raises(RankLost):
        world.run({0: engine.run, **{w.rank: w.run for w in team}})


def test_summary_names_the_lost_worker(tmp_path):
    run_local_job(tmp_path, workers=3, train={"epochs": 2}, **survive(crash_round=0))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["workers"] == 2
    assert summary["lost_workers"][0]["rank"] == 2


def test_fault_survive_refuses_what_it_cannot_shrink():
    with pytest.raises(ConfigError, match=r"`fault.survive` = True cannot be combined with model.optimizer"):
        config_from_dict({"fault": {"survive": True}, "model": {"optimizer": "lbfgs"}})


def test_fault_min_workers_must_be_positive():
    with pytest.raises(ConfigError, match=r"fault.min_workers.*Received: fault.min_workers=0"):
        config_from_dict({"fault": {"min_workers": 0}})


def test_a_lost_scheduler_ends_the_job_on_the_workers(tmp_path):
    engine, team, world = build_local_job(tmp_path, workers=2, **survive(crash_rank=0))
    scheduler = world.transports()[0]
    with pytest.raises(WorkerFailure, match="the scheduler \\(rank 0\\) was lost"):
        world.run({0: scheduler.crash, **{w.rank: w.run for w in team}})
