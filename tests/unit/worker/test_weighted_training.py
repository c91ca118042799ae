"""class_weight and sample_weight reach the workers' training loss: weights of zero leave a worker's
model where the round started it (Adam's step of a zero gradient is zero), weights of one train it."""

from __future__ import annotations

import numpy as np
from local_job import build_local_job

ONE_ROUND = {"train": {"epochs": 1, "batch_size": 64}}


def moved(job_workers) -> list[bool]:
    return [not np.allclose(worker.trained[0][1], worker.started_from[0]) for worker in job_workers]


def train_one_round(run_dir, class_weight=None, sample_weight=None) -> list:
    """One round of digits on two workers whose plan carries ``class_weight``; ``sample_weight(train, team)``
    gives the weight of every source row."""
    engine, team, world = build_local_job(run_dir, **ONE_ROUND)
    for worker in team:
        worker.data.class_weight = class_weight  # what the plan hands every worker (fit's class_weight)
    if sample_weight is not None:
        train = team[0].training.dataset.train
        train.weights = sample_weight(train, team)
    world.run({0: engine.run, **{w.rank: w.run for w in team}})
    return team


def test_class_weight_of_zero_for_every_class_stops_training_and_of_one_does_not(tmp_path):
    assert moved(train_one_round(tmp_path / "zero", {k: 0.0 for k in range(10)})) == [False, False]
    assert moved(train_one_round(tmp_path / "one", {k: 1.0 for k in range(10)})) == [True, True]


def test_sample_weight_applies_to_the_rows_of_each_workers_block(tmp_path):
    def only_worker_2(train, team):
        weights = np.zeros(len(train.labels), dtype=np.float32)
        weights[train.rows[team[1].data.fixed]] = 1.0
        return weights

    assert moved(train_one_round(tmp_path / "rows", sample_weight=only_worker_2)) == [False, True]


def test_class_weight_reaches_a_pipelines_batches_as_keras_applies_it(tmp_path):
    import tensorflow as tf
    from sklearn.datasets import load_digits

    from mpi_trainer.data.adapters import fit_input
    from mpi_trainer.launch.job_setup import JobInputs

    x, y = load_digits(return_X_y=True)
    dataset = tf.data.Dataset.from_tensor_slices(((x / 16.0).astype(np.float32), y)).batch(64)
    for name, weight, moves in (("zero", 0.0, [False, False]), ("one", 1.0, [True, True])):
        inputs = JobInputs(pipeline=fit_input(dataset, None, None), class_weight={k: weight for k in range(10)})
        engine, team, world = build_local_job(tmp_path / name, inputs=inputs, **ONE_ROUND)
        world.run({0: engine.run, **{w.rank: w.run for w in team}})
        assert moved(team) == moves
