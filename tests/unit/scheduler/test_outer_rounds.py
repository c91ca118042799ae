"""The outer optimizer in the synchronous engine, with real workers in one process (naive local transport).

Each test recomputes the scheduler's global weights by hand from what the workers trained, with
the pure :class:`OuterOptimizer`, and checks what the workers started the next round from.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from local_job import LocalJob, run_local_job

from mpi_trainer.algorithms import aggregation
from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.persistence.checkpoint import load_checkpoint

NESTEROV = {"outer_optimizer": "nesterov", "outer_learning_rate": 0.7, "outer_momentum": 0.9}
SGD = {"optimizer": "sgd", "learning_rate": 0.05}


def fresh_outer(job: LocalJob) -> OuterOptimizer:
    return OuterOptimizer(OuterSettings.from_config(job.engine.cfg, len(job.workers)))


def last_trained(job: LocalJob, round_index: int) -> list[tuple]:
    """Every worker's last report and weights of ``round_index`` (a rolled-back round runs twice)."""
    return [[t for t in w.trained if t[0].round == round_index][-1] for w in job.workers]


def by_hand(job: LocalJob, rounds: range, start: np.ndarray, outer: OuterOptimizer) -> list[np.ndarray]:
    """The global weights after each round: the outer step from the round's average (or weighted share)."""
    method, weights, out = job.engine.cfg.aggregation.method, start, []
    for round_index in rounds:
        trained = last_trained(job, round_index)
        aggregate = aggregation.combine([local for _, local in trained], [r.samples for r, _ in trained], method)
        weights = outer.step(weights, aggregate)
        out.append(weights)
    return out


def started_from(job: LocalJob, round_index: int) -> list[np.ndarray]:
    """What each worker trained ``round_index`` from (its last run of it)."""
    return [[s for s, t in zip(w.started_from, w.trained) if t[0].round == round_index][-1] for w in job.workers]


@pytest.mark.parametrize("settings", [
    {},
    {"train": {"sync_every": 3, "sync_warmup_epochs": 1, "sync_warmup_every": 4}},
    {"aggregation": {"method": "weighted"}, "data": {"rebalance": True}},
    {"evaluation": {"where": "workers"}},
    {"train": {"overlap_eval": True}},
], ids=["epoch_rounds", "sync_every_with_warmup", "weighted_rebalanced", "workers_score", "overlap_eval"])
def test_each_round_takes_the_outer_step_and_the_workers_train_from_its_result(tmp_path, settings):
    sections = {key: dict(value) for key, value in settings.items()}
    sections["aggregation"] = {**sections.get("aggregation", {}), **NESTEROV}
    sections["train"] = {"epochs": 4, **sections.get("train", {})}
    job = run_local_job(tmp_path, model=SGD, **sections)
    rounds = len(job.rounds())
    expected = by_hand(job, range(rounds), job.engine.initial_weights,
                       fresh_outer(job))
    np.testing.assert_allclose(job.engine.weights, expected[-1], atol=2e-5)
    for round_index in range(1, rounds):
        for start in started_from(job, round_index):
            np.testing.assert_allclose(start, expected[round_index - 1], atol=2e-5)
    # the outer step moved the model off the plain average
    plain = np.mean([local for _, local in last_trained(job, rounds - 1)], axis=0)
    assert np.abs(job.engine.weights - plain).max() > 1e-3
    assert job.summary["outer_optimizer"] == "nesterov"


def test_the_default_steps_nesterov_from_averaged_rounds_and_nothing_from_elected_ones(tmp_path):
    job = run_local_job(tmp_path / "average", model=SGD, aggregation={"outer_optimizer": "auto"}, train={"epochs": 3})
    assert job.summary["outer_optimizer"] == "nesterov"
    outer = OuterOptimizer(OuterSettings(name="nesterov", learning_rate=1.0, momentum=0.5))
    expected = by_hand(job, range(3), job.engine.initial_weights, outer)
    np.testing.assert_allclose(job.engine.weights, expected[-1], atol=2e-5)
    best = run_local_job(tmp_path / "best", aggregation={"outer_optimizer": "auto", "method": "best"},
                         train={"epochs": 1})
    assert best.summary["outer_optimizer"] == "none"
    winner = dict((report.rank, local) for report, local in best.trained(0))[int(best.rounds()[0]["winner"])]
    np.testing.assert_array_equal(best.engine.weights, winner)


def test_traffic_per_round_is_what_plain_averaging_sends(tmp_path):
    plain = run_local_job(tmp_path / "none", train={"epochs": 3}, aggregation={"outer_optimizer": "none"})
    outer = run_local_job(tmp_path / "nesterov", train={"epochs": 3}, aggregation=NESTEROV)
    model_bytes = plain.summary["model_bytes"]
    for a, b in zip(plain.rounds(), outer.rounds(), strict=True):
        assert abs(int(a["bytes"]) - int(b["bytes"])) < 64  # the same transfers; reports' numbers differ
        assert 2 * 2 * model_bytes <= int(b["bytes"]) < 2 * 2 * model_bytes + 20_000


def test_a_16_bit_wire_sends_the_outer_steps_result_rounded(tmp_path):
    job = run_local_job(tmp_path, model=SGD, train={"epochs": 3},
                        aggregation={**NESTEROV, "wire_dtype": "bfloat16"})
    wire, half = WireFormat("bfloat16"), np.float32(0.5)
    outer, weights = fresh_outer(job), job.engine.initial_weights
    for round_index in range(3):
        for start in started_from(job, round_index):  # what arrived: the global weights, rounded once
            np.testing.assert_array_equal(start, wire.decode(wire.encode(weights)))
        # what went up: each worker's half share, rounded, summed in float32 on the scheduler
        aggregate = sum(wire.decode(wire.encode(half * local)) for _, local in last_trained(job, round_index))
        weights = outer.step(weights, aggregate)
    np.testing.assert_allclose(job.engine.weights, weights, atol=1e-6)


def test_best_of_steps_from_the_elected_workers_weights(tmp_path):
    job = run_local_job(tmp_path, workers=3, model=SGD, train={"epochs": 2},
                        aggregation={**NESTEROV, "method": "best"})
    outer, weights = fresh_outer(job), job.engine.initial_weights
    for round_index, row in enumerate(job.rounds()):
        elected = dict((r.rank, w) for r, w in last_trained(job, round_index))[int(row["winner"])]
        weights = outer.step(weights, elected)
    np.testing.assert_array_equal(job.engine.weights, weights)


def test_the_checkpoint_holds_the_outer_state_and_an_elastic_resume_goes_on_from_it(tmp_path):
    first = run_local_job(tmp_path, model=SGD, train={"epochs": 2}, checkpoint={"every": 1}, aggregation=NESTEROV)
    arrays, meta = load_checkpoint(tmp_path / "checkpoint.h5")
    assert meta["round"] == 1 and sorted(k for k in arrays if k.startswith("outer_")) == ["outer_velocity"]
    outer = fresh_outer(first)  # the run's two rounds stepped by hand: the checkpoint holds their velocity
    np.testing.assert_allclose(arrays["weights"], by_hand(first, range(2), first.engine.initial_weights, outer)[-1],
                               atol=2e-5)
    np.testing.assert_allclose(arrays["outer_velocity"], outer.state["velocity"], atol=2e-5)
    np.testing.assert_array_equal(arrays["weights"], first.engine.weights)
    assert not first.engine.outer.state  # let go once the final checkpoint held it
    # three workers now: the outer state is the model's, not the workers'
    resumed = run_local_job(tmp_path, workers=3, resume=True, model=SGD, train={"epochs": 4},
                            checkpoint={"every": 1}, aggregation=NESTEROV)
    assert resumed.summary["resumed_after_round"] == 1
    outer = fresh_outer(resumed)
    outer.load_state(arrays, arrays["weights"].size)
    expected = by_hand(resumed, range(2, 4), arrays["weights"], outer)
    for start in started_from(resumed, 2):
        np.testing.assert_array_equal(start, arrays["weights"])
    np.testing.assert_allclose(resumed.engine.weights, expected[-1], atol=2e-5)
    # a fresh outer optimizer from the same weights goes elsewhere: the restored momentum was used
    fresh = by_hand(resumed, range(2, 3), arrays["weights"], fresh_outer(resumed))
    assert np.abs(fresh[0] - expected[0]).max() > 1e-4


def test_a_nan_rollback_takes_the_outer_state_back_with_the_weights(tmp_path):
    # no checkpoint yet: the rollback goes to the initial weights, and the outer optimizer starts fresh
    job = run_local_job(tmp_path, model=SGD, aggregation=NESTEROV, train={"epochs": 3, "nan_policy": "rollback"},
                        debug={"nan_rank": 1, "nan_round": 1})
    assert [(r["round"], r["checkpoint_round"]) for r in job.summary["rollbacks"]] == [(1, -1)]
    for start in started_from(job, 1):
        np.testing.assert_array_equal(start, job.engine.initial_weights)
    outer = fresh_outer(job)
    expected = by_hand(job, range(1, 3), job.engine.initial_weights, outer)
    np.testing.assert_allclose(job.engine.weights, expected[-1], atol=2e-5)


class WeightsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[np.ndarray] = []

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.seen.append(np.concatenate([np.ravel(w) for w in self.model.get_weights()]))


@pytest.mark.parametrize("where", ["scheduler", "workers"])
def test_keras_callbacks_see_the_stepped_weights_and_can_stop_the_job(tmp_path, where):
    # scored by the workers, the round's weights are not in rank 0's model until the callbacks need them
    seen = WeightsAtEpochEnd()
    stop = keras.callbacks.EarlyStopping(monitor="test_accuracy", mode="max", patience=0, min_delta=1.0)
    job = run_local_job(tmp_path, model=SGD, aggregation=NESTEROV, train={"epochs": 5}, callbacks=[seen, stop],
                        evaluation={"where": where})
    assert job.summary["stop_reason"] == "callback" and len(seen.seen) == 2
    expected = by_hand(job, range(2), job.engine.initial_weights, fresh_outer(job))
    for got, want in zip(seen.seen, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_a_round_redone_after_a_lost_worker_takes_one_outer_step(tmp_path):
    crash = {"crash_rank": 2, "crash_round": 1, "crash_phase": "contribute"}
    job = run_local_job(tmp_path, workers=3, model=SGD, aggregation=NESTEROV, train={"epochs": 3},
                        fault={"survive": True}, debug=crash)
    assert [int(r["workers"]) for r in job.rounds()] == [3, 2, 2]
    outer, weights = fresh_outer(job), job.engine.initial_weights
    for round_index in range(3):
        # the lost worker's partial round left nothing: each round is its last training by those who finished it
        trained = [[t for t in w.trained if t[0].round == round_index][-1] for w in job.workers
                   if round_index == 0 or w.link.transport.world_rank != 2]
        weights = outer.step(weights, np.mean([local for _, local in trained], axis=0, dtype=np.float32))
    np.testing.assert_allclose(job.engine.weights, weights, atol=2e-5)
