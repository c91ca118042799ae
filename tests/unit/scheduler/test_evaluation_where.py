"""``evaluation.where = "workers"``: each worker scores its shard of the global weights and the summed
metric state gives the scheduler exactly what one process scoring the whole split would."""

from __future__ import annotations

import time

import numpy as np
import pytest
from local_job import run_local_job
from sklearn.datasets import load_digits

from mpi_trainer.config import load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.job_setup import load_dataset_for_rank


def _one_hot_digits(path):
    digits = load_digits()
    np.savez(path, x=(digits.data / 16.0).astype(np.float32), y=np.eye(10, dtype=np.float32)[digits.target])
    return str(path)


@pytest.mark.parametrize("placement", ["shared", "scatter"])
def test_workers_score_their_shards_and_the_sums_equal_keras_evaluate(tmp_path, placement):
    # AUC's state is a confusion count per threshold: averaging the shards' AUCs would be wrong
    job = run_local_job(tmp_path / "run", workers=3, builder=__import__("user_models").compiled_one_hot,
                        data={"source": _one_hot_digits(tmp_path / "digits.npz"), "placement": placement,
                              "validation_size": 0.11},
                        evaluation={"where": "workers"}, early_stopping={"monitor": "val_auc"})
    dataset, model = job.engine.dataset, job.engine.model
    shards = [worker.data.evaluation for worker in job.workers]
    np.testing.assert_array_equal(np.concatenate([s.x_test for s in shards]), dataset.x_test)
    np.testing.assert_array_equal(np.concatenate([s.y_val for s in shards]), dataset.y_val)
    assert len({len(s.y_val) for s in shards}) == 2  # uneven shards: a plain mean of their scores would be off
    model.set_weights(job.engine.codec.unflatten(job.engine.weights))  # the last round's weights
    last = job.rounds()[-1]
    for split, x, y in (("test", dataset.x_test, dataset.y_test), ("val", dataset.x_val, dataset.y_val)):
        expected = model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
        for name in ("loss", "accuracy", "auc"):
            assert float(last[f"{split}_{name}"]) == pytest.approx(expected[name], abs=1e-6), (split, name)


def test_the_next_round_starts_from_the_scored_weights_without_another_broadcast(tmp_path):
    job = run_local_job(tmp_path / "run", workers=3, train={"epochs": 3}, evaluation={"where": "workers"})
    model_bytes = job.engine.wire_bytes
    for row in job.rounds():
        # one copy of the weights out to each worker and one back from each; a second broadcast
        # per round would add another third
        assert 2 * 3 * model_bytes < int(row["bytes"]) < 2.1 * 3 * model_bytes, row["bytes"]
    reference = run_local_job(tmp_path / "ref", workers=3, train={"epochs": 3})
    for ours, theirs in zip(job.rounds(), reference.rounds()):
        assert float(ours["test_loss"]) == pytest.approx(float(theirs["test_loss"]), abs=1e-6)


def test_workers_hold_the_version_of_the_weights_they_scored_until_the_engine_replaces_them(tmp_path):
    from mpi_trainer.scheduler.evaluation import WorkerEvaluator

    job = run_local_job(tmp_path / "run", workers=2, train={"epochs": 2}, evaluation={"where": "workers"})
    engine, evaluator = job.engine, job.engine.evaluator
    assert isinstance(evaluator, WorkerEvaluator)  # built with the engine, not swapped in later
    scored = evaluator.held_version
    assert scored is not None and evaluator.holds(scored)
    # the run's end put the kept weights in place: a new version, which the workers do not hold
    assert engine.weights_version > scored and not evaluator.holds(engine.weights_version)
    before = engine.weights_version
    engine.weights = engine.weights  # any replacement counts, even by the same array (a rollback may do that)
    assert engine.weights_version == before + 1


def test_a_worker_reads_only_its_part_of_the_test_split():
    cfg = load_config(None, ["data.source=digits", "evaluation.where=workers"])
    whole = load_dataset_for_rank(0, cfg, workers=3).x_test
    parts = [load_dataset_for_rank(rank, cfg, workers=3) for rank in (1, 2, 3)]
    assert [p.test_part for p in parts] == [(0, 3), (1, 3), (2, 3)]
    np.testing.assert_array_equal(np.concatenate([p.x_test for p in parts]), whole)
    assert load_dataset_for_rank(1, load_config(None, ["data.source=digits"]), workers=3).x_test.shape[0] == 0


@pytest.mark.parametrize("override, named", [
    ("aggregation.ssp=2", "aggregation.ssp=2"),
    ("train.overlap_eval=true", "train.overlap_eval=True"),
    ("model.optimizer=lbfgs", "model.optimizer='lbfgs'"),
])
def test_scoring_on_workers_is_refused_where_workers_never_wait(override, named):
    with pytest.raises(ConfigError, match="evaluation.where") as error:
        load_config(None, ["evaluation.where=workers", override])
    assert named in str(error.value)


def test_an_unknown_place_is_refused():
    with pytest.raises(ConfigError, match=r"evaluation.where.*'scheduler', 'workers'"):
        load_config(None, ["evaluation.where=gpu"])


def test_a_worker_with_no_rows_to_score_adds_zeros_of_every_metric():
    from mpi_trainer.models import flat_metric_state, metrics_from_flat, summed_metric_state

    x, y = load_digits(return_X_y=True)
    model = __import__("user_models").compiled_one_hot((64,), 10)
    one_hot = np.eye(10, dtype=np.float32)[y]
    whole = flat_metric_state(summed_metric_state(model, x[:100], one_hot[:100], 32))
    empty = flat_metric_state(summed_metric_state(model, x[:0], one_hot[:0], 32))
    assert empty.shape == whole.shape and not empty.any()
    assert metrics_from_flat(model, whole + empty) == metrics_from_flat(model, whole)


def test_a_worker_that_does_not_score_is_named_by_the_watchdog(tmp_path, monkeypatch):
    from mpi_trainer.errors import WorkerFailure
    from mpi_trainer.worker import Worker

    scoring = Worker.evaluate

    def stalled(self, order):
        if self.rank == 2:
            time.sleep(6)
        scoring(self, order)

    monkeypatch.setattr(Worker, "evaluate", stalled)
    with pytest.raises(WorkerFailure, match=r"worker rank 2 on host \S+ did not score round 0 within "
                                            r"watchdog.worker_timeout=3 s"):
        run_local_job(tmp_path / "run", train={"epochs": 2}, evaluation={"where": "workers"},
                      watchdog={"worker_timeout": 3.0})


def test_a_worker_holding_another_part_of_the_test_split_is_refused():
    from mpi_trainer.data.placement import own_shard

    dataset = load_dataset_for_rank(1, load_config(None, ["data.source=digits", "evaluation.where=workers"]),
                                    workers=3)
    with pytest.raises(ValueError, match=r"worker rank 2 holds part \(0, 3\) of the test split, expected part "
                                         r"\(1, 3\)"):
        own_shard(dataset, 2, 3)


def test_a_metric_state_of_the_wrong_size_is_refused():
    from mpi_trainer.models import metrics_from_flat

    model = __import__("user_models").compiled_one_hot((64,), 10)
    model.evaluate(np.zeros((4, 64)), np.eye(10)[[0, 1, 2, 3]], verbose=0)
    with pytest.raises(ValueError, match=r"metric state of 3 values does not fit this model's metrics \(\d+ values\)"):
        metrics_from_flat(model, np.zeros(3))
