"""Epochs of a fit on the user's model, in one process: a scheduler and two workers as threads of a
LocalWorld, each with its own copy of a small BatchNormalization model, as each rank of a job holds one."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.trainer.run_record import FitRecord
from mpi_trainer.trainer.scheduler import SchedulerRounds
from mpi_trainer.trainer.shares import array_share
from mpi_trainer.trainer.state import ModelState
from mpi_trainer.trainer.worker import WorkerRounds


def bn_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), keras.layers.BatchNormalization(momentum=0.5),
                              keras.layers.ReLU(), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.optimizer.build(model.trainable_variables)
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(240, 8)).astype("float32") * 0.01  # a variance far below BatchNorm's initial 1
    return x, (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0).astype("int64")


class SetRate(keras.callbacks.Callback):
    """Sets the learning rate on the scheduler's model before epoch 1, as ReduceLROnPlateau would."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            self.model.optimizer.learning_rate = 0.002


def input_bn_model() -> keras.Model:
    """BatchNormalization on the inputs: its batch statistics do not depend on the training."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(momentum=0.9),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    return model


def run_job(outer: str, epochs: int = 3, shuffle: bool = True, rows: tuple[np.ndarray, np.ndarray] | None = None,
            make_model=bn_model, workers_score: bool = False, elects: bool = False) -> dict[int, dict]:
    """A fit on 2 workers; ``shuffle`` both shuffles each epoch's batches and deals the rows out at random."""
    x, y = rows or data()
    world = LocalWorld(3)
    transports = world.transports()
    models = {rank: make_model() for rank in range(3)}

    def scheduler() -> dict:
        model = models[0]
        state = ModelState(model)
        callbacks = keras.callbacks.CallbackList([SetRate()], add_history=True, model=model, epochs=epochs,
                                                 steps=None, verbose=0)
        optimizer = OuterOptimizer(OuterSettings(outer, 1.0, 0.5))
        record = FitRecord(None, {}, {})
        rounds = SchedulerRounds(transports[0], model, state, optimizer, callbacks,
                                 {"x": x[:60], "y": y[:60]}, 1, record)
        rounds.workers_score, rounds.elects = workers_score, elects
        rounds.run(0, epochs)
        return {"history": callbacks.callbacks[-1].history, "weights": model.get_weights(),
                "flat": state.read(state.empty()), "rows": record.rows, "traffic": record.traffic,
                "state_bytes": state.size * 4, "clocks": state.clocks,
                "moments": [np.asarray(v) for v in model.optimizer.variables],
                "iterations": int(model.optimizer.iterations), "rate": float(model.optimizer.learning_rate)}

    def worker(rank: int) -> dict:
        model = models[rank]
        share_x, share_y, _ = array_share((x, y, None), 2, rank - 1, shuffle)
        share = {"x": share_x, "y": share_y, "batch_size": 30, "shuffle": shuffle}
        validation = {"x": x[:60][30 * (rank - 1):30 * rank], "y": y[:60][30 * (rank - 1):30 * rank]}
        rounds = WorkerRounds(transports[rank], model, ModelState(model), share, len(share_x), False,
                              validation=validation if workers_score else None)
        rounds.election = {"x": x[:60], "y": y[:60]} if elects else None
        rounds.run()
        return {"weights": model.get_weights(), "iterations": int(model.optimizer.iterations),
                "moments": [np.asarray(v) for v in model.optimizer.variables],
                "rate": float(model.optimizer.learning_rate)}

    return world.run({0: scheduler, 1: lambda: worker(1), 2: lambda: worker(2)}, timeout=180)


@pytest.fixture(scope="module")
def nesterov() -> dict[int, dict]:
    return run_job("nesterov")


def test_every_rank_ends_with_the_same_state_and_the_steps_of_every_worker(nesterov):
    for rank in (1, 2):
        for mine, theirs in zip(nesterov[0]["weights"], nesterov[rank]["weights"]):
            np.testing.assert_array_equal(mine, theirs)
        assert nesterov[rank]["iterations"] == nesterov[0]["iterations"]
    assert nesterov[0]["iterations"] == 3 * 4 * 2  # 3 epochs of 120 rows in batches of 30, on each of 2 workers


def test_batchnorm_statistics_are_averaged_not_stepped_by_the_outer_optimizer(nesterov):
    model = bn_model()
    model.set_weights(nesterov[0]["weights"])
    bn = model.layers[1]
    assert np.all(np.asarray(bn.moving_variance) > 0)  # an outer step on these drives them negative
    history = nesterov[0]["history"]
    assert np.all(np.isfinite(history["val_loss"])), history  # a negative variance scores NaN
    assert history["val_accuracy"][-1] > 0.6, history  # the statistics are those the weights trained with


def test_the_schedulers_learning_rate_reaches_the_workers_and_is_not_averaged(nesterov):
    for rank in (0, 1, 2):
        assert nesterov[rank]["rate"] == pytest.approx(0.002)


def test_every_rounds_bytes_are_counted_the_state_each_way_for_each_worker_and_the_small_messages(nesterov):
    scheduler = nesterov[0]
    state_out = 2 * scheduler["state_bytes"]  # rank 0's broadcast reaches 2 workers
    sums_in = 2 * (scheduler["state_bytes"] + 4 * (1 + scheduler["clocks"]))  # each worker's part of the sum
    for index, row in enumerate(scheduler["rows"]):
        # the initial state before the first round; again before the second (SetRate changed rank 0's rate)
        handed = state_out if index < 2 else 0
        # each round's sum comes in and the combined state goes back out with it; + orders and reports
        assert handed + sums_in + state_out < row["bytes"] < handed + sums_in + state_out + 8192, row
    final = scheduler["traffic"] - sum(row["bytes"] for row in scheduler["rows"])
    assert 0 < final < 4096  # the workers hold the final state already: the stop order alone


def test_history_holds_the_workers_training_logs_and_the_schedulers_validation(nesterov):
    history = nesterov[0]["history"]
    assert set(history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(values) == 3 for values in history.values())
    assert history["loss"][-1] < history["loss"][0]


def test_without_an_outer_optimizer_weights_are_the_workers_mean_and_moving_averages_one_process_s():
    plain = run_job("none", epochs=1, shuffle=False)
    x, y = data()
    start = bn_model()
    alone = []
    for rank in (1, 2):  # each worker's epoch, replayed alone from the same start on the same share
        model = bn_model()
        share_x, share_y, _ = array_share((x, y, None), 2, rank - 1, False)
        model.fit(share_x, share_y, batch_size=30, epochs=1, verbose=0, shuffle=False)
        alone.append(model)
    state = ModelState(start)
    first, second = (ModelState(model).read(state.empty()) for model in alone)
    began = state.read(state.empty())
    got = plain[0]["flat"]
    for rule, low, high in zip(state.rules, state.offsets[:-1], state.offsets[1:]):
        if rule.kind == "mean":  # the trainable weights (and the learning rate, the scheduler's)
            expected = (first[low:high] + second[low:high]) / 2
        else:  # BatchNorm's statistics (4 updates per worker), Adam's moments (4 steps per worker)
            decay = rule.decay
            statistic = [(mine[low:high] - decay**4 * began[low:high]) / (1 - decay**4) for mine in (first, second)]
            expected = decay**8 * began[low:high] + (1 - decay**8) * (statistic[0] + statistic[1]) / 2
        np.testing.assert_allclose(got[low:high], expected, rtol=1e-4, atol=1e-6)
    assert {rule.kind for rule in state.rules} == {"mean", "moving"}
    assert plain[0]["iterations"] == 8


def test_batchnorm_statistics_match_one_process_that_trained_on_every_workers_batches():
    """Every batch holds the same rows (stationary statistics): the combined moving mean and variance of
    two workers after one epoch equal one process's after the epoch's batches of both."""
    rng = np.random.default_rng(1)
    block = rng.normal(3.0, 2.0, size=(30, 8)).astype("float32")  # one batch's rows, repeated
    x = np.tile(block, (8, 1))
    y = (x[:, 0] > 3).astype("int64")
    plain = run_job("none", epochs=1, shuffle=False, rows=(x, y), make_model=input_bn_model)
    one = input_bn_model()
    one.fit(x, y, batch_size=30, epochs=1, verbose=0, shuffle=False)  # 8 batches, as both workers' together
    combined = input_bn_model()
    combined.set_weights(plain[0]["weights"])
    bn, reference = combined.layers[0], one.layers[0]
    start = np.asarray(input_bn_model().layers[0].moving_mean)
    averaged = 0.9**4 * start + (1 - 0.9**4) * np.asarray(reference.moving_mean)  # what plain averaging held
    assert np.abs(np.asarray(bn.moving_mean) - averaged).max() > 0.5
    for name in ("moving_mean", "moving_variance"):
        mine, theirs = (np.asarray(getattr(layer, name)) for layer in (bn, reference))
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_workers_scoring_their_shares_give_the_schedulers_scores_and_the_state_travels_once():
    alone = run_job("nesterov", shuffle=False)
    shared = run_job("nesterov", shuffle=False, workers_score=True)
    for name in ("val_loss", "val_accuracy"):
        np.testing.assert_allclose(shared[0]["history"][name], alone[0]["history"][name], rtol=1e-5)
    for rank in (0, 1, 2):
        for mine, theirs in zip(shared[rank]["weights"], alone[rank]["weights"]):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    extra = [mine["bytes"] - theirs["bytes"] for mine, theirs in zip(shared[0]["rows"], alone[0]["rows"])]
    # the combined state came back to the workers with each round's sum: they score what they hold, and
    # only the metric states travel for it
    assert all(0 < bytes_ < 1024 for bytes_ in extra), extra
    assert shared[0]["traffic"] - sum(row["bytes"] for row in shared[0]["rows"]) < 1024


def test_best_of_keeps_the_whole_state_of_the_worker_that_scores_best_and_its_scores():
    """aggregation.method = "best": the combined state is the elected worker's, weights, BatchNorm statistics,
    optimizer moments and step count alike, and the epoch's validation scores are its scores."""
    x, y = data()
    best = run_job("none", epochs=1, shuffle=False, elects=True)
    alone = {}
    for index in (0, 1):
        model = bn_model()
        share_x, share_y, _ = array_share((x, y, None), 2, index, False)
        model.fit(share_x, share_y, batch_size=30, shuffle=False, epochs=1, verbose=0)
        alone[index] = (model, model.evaluate(x[:60], y[:60], verbose=0, return_dict=True))
    from mpi_trainer.algorithms.aggregation import elect

    winner = elect({index: (scores["accuracy"], scores["loss"]) for index, (_, scores) in alone.items()})
    model, scores = alone[winner]
    for rank in (0, 1, 2):
        for mine, theirs in zip(best[rank]["weights"], model.get_weights(), strict=True):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
        for mine, theirs in zip(best[rank]["moments"][2:], [np.asarray(v) for v in model.optimizer.variables][2:]):
            np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-7)
        assert best[rank]["iterations"] == 4  # the winner's steps only: 120 rows in batches of 30
    assert best[0]["history"]["val_loss"] == [pytest.approx(scores["loss"], rel=1e-6)]
    assert best[0]["history"]["val_accuracy"] == [pytest.approx(scores["accuracy"])]


def test_averaging_every_step_is_synchronous_sgd_on_both_workers_batches_together():
    """train.sync_every = 1, plain averaging, SGD: each round is one step of the two workers' batches as one
    batch of twice the size, so the fit ends where one process ends on those batches."""
    x, y = data()
    world = LocalWorld(3)
    transports = world.transports()

    def dense() -> keras.Model:
        keras.utils.set_random_seed(4)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy")
        return model

    models = {rank: dense() for rank in range(3)}

    def scheduler() -> list:
        callbacks = keras.callbacks.CallbackList([], add_history=True, model=models[0], epochs=2, verbose=0)
        rounds = SchedulerRounds(transports[0], models[0], ModelState(models[0]), OuterOptimizer(OuterSettings()),
                                 callbacks, None, 1, FitRecord(None, {}, {}))
        rounds.sync_every = lambda epoch: 1
        rounds.plan_parts = lambda workers, every: 4  # 120 rows a worker in batches of 30
        rounds.run(0, 2)
        return models[0].get_weights()

    def worker(rank: int) -> None:
        share_x, share_y, _ = array_share((x, y, None), 2, rank - 1, False)
        share = {"x": share_x, "y": share_y, "batch_size": 30, "shuffle": False}
        rounds = WorkerRounds(transports[rank], models[rank], ModelState(models[rank]), share, len(share_x), False)
        rounds.run()

    combined = world.run({0: scheduler, 1: lambda: worker(1), 2: lambda: worker(2)}, timeout=180)[0]
    one = dense()
    batches = [np.concatenate([part[30 * step:30 * (step + 1)], part[120 + 30 * step:120 + 30 * (step + 1)]])
               for part in (x, y) for step in range(4)]
    one.fit(np.concatenate(batches[:4]), np.concatenate(batches[4:]), batch_size=60, epochs=2, shuffle=False,
            verbose=0)
    for mine, theirs in zip(combined, one.get_weights(), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)


def test_ranks_whose_metric_states_differ_are_named_before_the_sum():
    from mpi_trainer.trainer.round_protocol import agree_on_metric_size

    world = LocalWorld(3)
    transports = world.transports()

    def rank(index: int) -> str:
        try:
            agree_on_metric_size(transports[index], 4 if index < 2 else 6)
        except RuntimeError as exc:
            return str(exc)
        return ""

    said = world.run({index: lambda index=index: rank(index) for index in range(3)}, timeout=30)
    assert all("Received: [4, 4, 6] values by rank" in said[index] for index in range(3)), said


class Warnings:
    def __init__(self):
        self.said = []

    def warn(self, message):
        self.said.append(message)


def test_the_log_says_so_when_the_workers_train_but_no_optimizer_found_steps():
    model = bn_model()
    record = Warnings()
    rounds = SchedulerRounds(None, model, ModelState(model), None, None, None, 1, record)
    rounds.check_optimizers_stepped(0, np.array([4.0, 0.0]))  # 4 batches; model.optimizer took no step
    rounds.check_optimizers_stepped(1, np.array([4.0, 0.0]))  # said once
    assert len(record.said) == 1 and "none of the model's optimizers found (Adam" in record.said[0]
    stepped = SchedulerRounds(None, model, ModelState(model), None, None, None, 1, Warnings())
    stepped.check_optimizers_stepped(0, np.array([4.0, 8.0]))
    assert not stepped.record.said


def test_a_rounds_arrays_go_to_keras_as_its_own_pipeline_without_autotuning_and_train_alike():
    """Keras' adapter's batches, shuffled and class-weighted as fit does it, with tf.data's autotuning off (its
    iterator's end can wait an epoch's time), so a fit on them ends where a fit on the arrays ends."""
    from mpi_trainer.trainer.round_protocol import array_pipeline

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the pipeline is TensorFlow's; other backends take the arrays as they are")
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(50, 4)).astype("float32"), rng.integers(0, 2, 50)
    share = {"x": x, "y": y, "sample_weight": None, "batch_size": 8, "shuffle": False,
             "class_weight": {0: 1.0, 1: 3.0}, "steps_per_epoch": None}
    given = array_pipeline(share, training=True)
    assert given["steps_per_epoch"] == 7 and "y" not in given and "class_weight" not in given
    assert given["shuffle"] is False  # the adapter shuffled it; Keras would warn that a dataset's is ignored
    assert given["x"].options().autotune.enabled is False
    fitted = []
    for arguments in (share, given):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
        for epoch in range(2):  # one epoch a call, as a worker's rounds are
            model.fit(**arguments, epochs=epoch + 1, initial_epoch=epoch, verbose=0)
        fitted.append(model.get_weights())
    for mine, keras_own in zip(fitted[1], fitted[0], strict=True):
        np.testing.assert_allclose(mine, keras_own, rtol=1e-6, atol=1e-7)  # the class weights applied once
    assert array_pipeline({**share, "steps_per_epoch": 3}, training=True)["x"] is x  # a count given: as it is


@pytest.mark.parametrize("outer_name", ["none", "nesterov"])
def test_a_rounds_sum_combined_part_by_part_as_it_arrives_equals_combining_it_whole(outer_name):
    """Rank 0 combines each part of the sum as it arrives (weights averaged, Adam's moments as one process
    holds them, the outer step on the trainable part): the result is the whole sum's, whatever the parts."""
    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
    from mpi_trainer.trainer.scheduler import RoundCombine
    from mpi_trainer.trainer.state import ModelState, build_optimizers

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7), keras.layers.BatchNormalization(),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state = ModelState(model)
    rng = np.random.default_rng(3)
    before = rng.normal(size=state.size).astype(np.float32)
    summed = rng.normal(size=state.size).astype(np.float32) * 2
    steps = np.array([8.0, 8.0])
    settings = OuterSettings(outer_name, learning_rate=0.7, momentum=0.6)
    whole_outer, parts_outer = OuterOptimizer(settings), OuterOptimizer(settings)
    for round_ in range(2):  # the second round steps from the velocity the first left
        whole = summed.copy()
        state.combine(whole, before, 2.0, steps)
        state.keep_rates(whole, before)  # rank 0's learning rate, not the workers' average
        if whole_outer.active:
            whole_outer.step(before[:state.trainable_size], whole[:state.trainable_size],
                             out=whole[:state.trainable_size])
        in_parts = summed.copy()
        combining = RoundCombine(state, parts_outer, in_parts, before, 2.0, steps)
        cuts = [0, 5, 6, state.trainable_size + 1, state.size - 9, state.size]  # across variables and spans
        for start, stop in zip(cuts, cuts[1:]):
            combining.part(start, stop)
        assert combining.finite
        np.testing.assert_allclose(in_parts, whole, rtol=1e-6, atol=1e-7)
        summed = summed * np.float32(0.9 + round_)


def test_a_non_finite_part_of_the_sum_is_named_and_the_outer_step_is_put_back():
    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
    from mpi_trainer.trainer.round_protocol import NonFinite, Report
    from mpi_trainer.trainer.run_record import FitRecord
    from mpi_trainer.trainer.scheduler import RoundCombine, SchedulerRounds
    from mpi_trainer.trainer.state import ModelState, build_optimizers

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    build_optimizers(model)
    state, outer = ModelState(model), OuterOptimizer(OuterSettings("nesterov", momentum=0.5))
    outer.step(np.ones(state.trainable_size, np.float32), np.zeros(state.trainable_size, np.float32))
    kept = outer.snapshot()
    rounds = SchedulerRounds(None, model, state, outer, None, None, 1, FitRecord(None, {}, {}))
    rounds.outer_saved = outer.snapshot()
    summed = np.ones(state.size, np.float32)
    summed[state.trainable_size - 2] = np.inf  # in the second part: the first was stepped already
    combining = RoundCombine(state, outer, summed, np.zeros(state.size, np.float32), 2.0, np.array([4.0, 4.0]))
    combining.part(0, 10)
    combining.part(10, state.size)
    assert not combining.finite
    report = Report({"loss": 0.5}, 4, 32, 0.1, state.read_integers())
    with pytest.raises(NonFinite, match="non-finite aggregated weights"):
        rounds.combine(3, [report, report], combining)
    np.testing.assert_array_equal(outer.state["velocity"], kept["velocity"])


def test_a_round_rolled_back_between_an_epochs_rounds_leaves_rank_0s_model_at_the_rounds_start():
    """Between the rounds of an epoch rank 0's model lags the combined state (it goes out from the buffer);
    a round that is rolled back, or a fit that stops on it, leaves the model with the state that round
    started from, as scoring, callbacks and the checkpoint expect."""
    from mpi_trainer.algorithms.outer_optimizer import OuterOptimizer, OuterSettings
    from mpi_trainer.trainer.round_protocol import NonFinite
    from mpi_trainer.trainer.run_record import FitRecord
    from mpi_trainer.trainer.scheduler import SchedulerRounds
    from mpi_trainer.trainer.state import ModelState, build_optimizers

    for policy, again in (("rollback", True), ("stop", False)):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(keras.optimizers.Adam(0.01), "mse")
        build_optimizers(model)
        state = ModelState(model)
        rounds = SchedulerRounds(None, model, state, OuterOptimizer(OuterSettings()), None, None, 1,
                                 FitRecord(None, {}, {}))
        started = state.read(state.empty()) + np.float32(1.5)  # the round's start: the last round's combine
        rounds.before[:] = started
        rounds.latest = rounds.before
        rounds.nan_policy = policy
        assert rounds.roll_back(1, NonFinite("non-finite aggregated weights", [])) is again
        held = state.read(state.empty())
        np.testing.assert_array_equal(held[:state.model_size], started[:state.model_size])  # the model's variables
        assert float(model.optimizer.learning_rate) == pytest.approx((0.01 + 1.5) / (2 if again else 1))
        assert rounds.latest is None
