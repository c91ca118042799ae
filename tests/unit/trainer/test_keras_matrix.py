"""Keras' surface, proven against one process: with one worker, ``fit_model`` equals plain ``model.fit``.

The rows are generated from what Keras exports, not picked by hand: every optimizer class in
``keras.optimizers``, every option of the optimizers' base class, every callback class in
``keras.callbacks``, and the model kinds and stateful layers a script trains. A Keras release that adds
an optimizer, an option or a callback fails :func:`test_every_part_of_keras_has_a_row` until it has a
row here. Each row builds the same model twice with one seed, fits it with plain Keras in this process
and with mpi_trainer on a scheduler and one worker (threads of a LocalWorld), and compares the History
and the final weights. Data is not shuffled, so both see the same batches in the same order; the rest
(the optimizer's moments and step counts, the EMA, the learning rate a callback or a schedule sets, the
RNG of Dropout) is what a round must carry over for the two to agree.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import pytest
from keras.src.optimizers.base_optimizer import BaseOptimizer  # the options every optimizer takes

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.errors import InputError, Preempted
from mpi_trainer.persistence.preemption import Preemption
from mpi_trainer.trainer.fit import fit_model
from tests.unit.trainer.test_fit_again import placed_in_place

rng = np.random.default_rng(11)
X = rng.normal(size=(96, 6)).astype("float32")
Y = ((X[:, 0] + X[:, 1] > 0).astype("int64") + (X[:, 2] > 0.4).astype("int64"))
X_VAL, Y_VAL = X[:32] * 1.1, Y[:32]
EPOCHS, BATCH = 3, 16
# Float32 sums in another order (the combine's arithmetic on one worker's state): the same to ~1e-6
TOLERANCE = {"rtol": 2e-5, "atol": 2e-6}


def sequential(optimizer: Any = None, *layers: Any) -> keras.Model:
    model = keras.Sequential([keras.Input((6,)), *layers, keras.layers.Dense(12, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer or keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# -- the optimizers: every class keras.optimizers exports ------------------------------------------------
OPTIMIZERS: dict[str, Callable[[], Any] | None] = {
    "Adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "Adafactor": lambda: keras.optimizers.Adafactor(0.01),
    "Adagrad": lambda: keras.optimizers.Adagrad(0.05),
    "Adam": lambda: keras.optimizers.Adam(0.01),
    "AdamW": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01),
    "Adamax": lambda: keras.optimizers.Adamax(0.01),
    "Ftrl": lambda: keras.optimizers.Ftrl(0.05),
    "Lamb": lambda: keras.optimizers.Lamb(0.01),
    "Lion": lambda: keras.optimizers.Lion(0.001),
    "Muon": lambda: keras.optimizers.Muon(0.01),
    "Nadam": lambda: keras.optimizers.Nadam(0.01),
    "RMSprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5),
    "SGD": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "ScheduleFreeAdamW": lambda: keras.optimizers.ScheduleFreeAdamW(0.01),
    "LossScaleOptimizer": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01)),
    # not optimizers a model compiles with on its own: the base class, and the maps of several optimizers
    "Optimizer": None, "MultiOptimizer": None, "OptimizerMap": None,
}

# -- every option of the optimizers' base class -------------------------------------------------------
OPTIONS: dict[str, dict[str, Any] | None] = {
    "learning_rate": {"learning_rate": keras.optimizers.schedules.ExponentialDecay(0.02, 4, 0.5)},
    "weight_decay": {"weight_decay": 0.05},
    "clipnorm": {"clipnorm": 0.1},
    "clipvalue": {"clipvalue": 0.01},
    "global_clipnorm": {"global_clipnorm": 0.1},
    "use_ema": {"use_ema": True, "ema_momentum": 0.9},
    "ema_momentum": {"use_ema": True, "ema_momentum": 0.5},
    "ema_overwrite_frequency": {"use_ema": True, "ema_momentum": 0.9, "ema_overwrite_frequency": 4},
    "gradient_accumulation_steps": {"gradient_accumulation_steps": 2},
    "loss_scale_factor": {"loss_scale_factor": 8.0},
    "name": {"name": "renamed"},
    "kwargs": None,  # the base class' catch-all for deprecated names
}


def with_option(option: str) -> Callable[[], keras.Model]:
    return lambda: sequential(keras.optimizers.Adam(**{"learning_rate": 0.01, **(OPTIONS[option] or {})}))


# -- the callbacks: every class keras.callbacks exports ---------------------------------------------------
def lr_schedule(epoch: int, rate: float) -> float:
    return 0.02 / (1 + epoch)


class Logged(keras.callbacks.Callback):
    """Records the learning rate at each epoch's start, as a script's callback reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


CALLBACKS: dict[str, Callable[[Any], list[Any]] | None] = {
    "BackupAndRestore": lambda tmp: [keras.callbacks.BackupAndRestore(str(tmp / "backup"))],
    "CSVLogger": lambda tmp: [keras.callbacks.CSVLogger(str(tmp / "log.csv"))],
    "EarlyStopping": lambda tmp: [keras.callbacks.EarlyStopping("loss", patience=0, min_delta=0.05,
                                                                restore_best_weights=True)],
    "LambdaCallback": lambda tmp: [keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logs.update(doubled=2 * logs["loss"]))],
    "LearningRateScheduler": lambda tmp: [keras.callbacks.LearningRateScheduler(lr_schedule)],
    "ModelCheckpoint": lambda tmp: [keras.callbacks.ModelCheckpoint(str(tmp / "best.weights.h5"), "val_loss",
                                                                    save_best_only=True, save_weights_only=True)],
    "ReduceLROnPlateau": lambda tmp: [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0,
                                                                        min_delta=10.0)],
    "SwapEMAWeights": lambda tmp: [keras.callbacks.SwapEMAWeights(swap_on_epoch=True)],
    "TensorBoard": lambda tmp: [keras.callbacks.TensorBoard(str(tmp / "board"))],
    "TerminateOnNaN": lambda tmp: [keras.callbacks.TerminateOnNaN()],
    # the machinery every fit has (History, the progress bar), the base classes, a callback that posts to a
    # server, and Orbax's checkpointing (the JAX backend's, which needs the orbax package)
    "Callback": None, "CallbackList": None, "History": None, "ProgbarLogger": None, "RemoteMonitor": None,
    "OrbaxCheckpoint": None,
}


# -- model kinds and stateful layers ----------------------------------------------------------------------
def functional() -> keras.Model:
    inputs = keras.Input((6,), name="features")
    hidden = keras.layers.Dense(12, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.Concatenate()([hidden, inputs]))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(12, activation="relu")
        self.out = keras.layers.Dense(3, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(inputs))


class OwnTrainStep(Subclassed):
    """A train step of its own (keras.io's "customizing what happens in fit"), with its own loss tracker."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x, y, self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


class OwnComputeLoss(Subclassed):
    """Its own ``compute_loss``: the compiled loss plus an L2 term on the outputs."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.01 * keras.ops.mean(keras.ops.square(y_pred))


class NeverCalled(keras.Model):
    """A model ``fit`` never calls (a GAN's or a VAE's shape): sub-models and a train_step of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.net = keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                                     keras.layers.Dense(3, activation="softmax")])
        self.tracker = keras.metrics.Mean(name="loss")

    def train_step(self, data):
        import tensorflow as tf

        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, self.net(x, training=True)))
        self.optimizer.apply(tape.gradient(loss, self.net.trainable_variables), self.net.trainable_variables)
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    def test_step(self, data):
        x, y = data
        loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, self.net(x)))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


def compiled(model: keras.Model, metrics: bool = True) -> keras.Model:
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy",
                  metrics=["accuracy"] if metrics else None)
    return model


def adapted_normalization() -> keras.layers.Layer:
    layer = keras.layers.Normalization()
    layer.adapt(X)
    return layer


MODELS: dict[str, Callable[[], keras.Model]] = {
    "sequential": lambda: sequential(),
    "functional": functional,
    "subclassed": lambda: compiled(Subclassed()),
    "own_train_step": lambda: compiled(OwnTrainStep(), metrics=False),
    "own_compute_loss": lambda: compiled(OwnComputeLoss()),
    "never_called_by_fit": lambda: compiled(NeverCalled(), metrics=False),
    # no bias before BatchNormalization (its gradient is rounding noise, which Adam scales up to the rate)
    "batch_normalization": lambda: sequential(None, keras.layers.Dense(8, use_bias=False),
                                              keras.layers.BatchNormalization()),
    "adapted_normalization": lambda: sequential(None, adapted_normalization()),
    "dropout": lambda: sequential(None, keras.layers.Dense(16, activation="relu"), keras.layers.Dropout(0.3)),
    "gaussian_noise": lambda: sequential(None, keras.layers.GaussianNoise(0.1)),
}


def rows() -> dict[str, tuple[Callable[[], keras.Model], Callable[[Any], list[Any]]]]:
    """Every row: (the model's builder, its callbacks given a directory to write in)."""
    none: Callable[[Any], list[Any]] = lambda tmp: []  # noqa: E731
    found = {f"model:{name}": (build, none) for name, build in MODELS.items()}
    found |= {f"optimizer:{name}": ((lambda make=make: sequential(make())), none)
              for name, make in OPTIMIZERS.items() if make is not None}
    found |= {f"option:{name}": (with_option(name), none) for name, value in OPTIONS.items() if value is not None}
    for name, make_callbacks in CALLBACKS.items():
        if make_callbacks is None:
            continue
        build = with_option("use_ema") if name == "SwapEMAWeights" else (lambda: sequential())
        found[f"callback:{name}"] = (build, lambda tmp, make=make_callbacks: [*make(tmp), Logged()])
    return found


ROWS = rows()


def test_every_part_of_keras_has_a_row():
    """A Keras release's new optimizer, optimizer option or callback fails here until the matrix covers it."""
    exported = {
        "optimizers": {n for n in dir(keras.optimizers) if isinstance(getattr(keras.optimizers, n), type)},
        "options": set(inspect.signature(BaseOptimizer.__init__).parameters) - {"self"},
        "callbacks": {n for n in dir(keras.callbacks) if isinstance(getattr(keras.callbacks, n), type)},
    }
    covered = {"optimizers": set(OPTIMIZERS), "options": set(OPTIONS), "callbacks": set(CALLBACKS)}
    assert {kind: sorted(exported[kind] - covered[kind]) for kind in exported} == {kind: [] for kind in exported}


@pytest.fixture(autouse=True)
def start_in_place(monkeypatch):
    monkeypatch.setattr("mpi_trainer.launch.job.start_rank", placed_in_place)


def fitted(build: Callable[[], keras.Model], callbacks: list[Any], data_parallel: bool,
           run_dir: Any = None) -> dict[str, Any]:
    """The History, the final weights and the rates a callback saw, after plain Keras' fit or one worker's."""
    arguments = {"x": X, "y": Y, "batch_size": BATCH, "epochs": EPOCHS, "verbose": 0, "shuffle": False,
                 "validation_data": (X_VAL, Y_VAL), "callbacks": callbacks}
    if not data_parallel:
        keras.utils.set_random_seed(3)
        model = build()
        history = model.fit(**arguments)
        return {"history": history.history, "weights": model.get_weights(), "callbacks": callbacks}
    world = LocalWorld(2)
    transports = world.transports()
    models = []
    for _ in range(2):  # each rank runs the script: the same seed before its model
        keras.utils.set_random_seed(3)
        models.append(build())

    def rank(index: int) -> Any:
        mine = {**arguments, "callbacks": callbacks if index == 0 else []}
        if index and any(isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks):
            mine["callbacks"] = [c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)]
        try:
            history = fit_model(transports[index], models[index], mine, None, [], run_dir, False)
        except Preempted as exc:
            return exc
        return {"history": history.history, "weights": models[index].get_weights(), "summary": history.summary}

    done = world.run({0: lambda: rank(0), 1: lambda: rank(1)}, timeout=120)
    if isinstance(done[0], BaseException):
        raise done[0]
    return {**done[0], "worker": done[1], "callbacks": callbacks}


def assert_same(mine: dict[str, Any], plain: dict[str, Any]) -> None:
    assert set(mine["history"]) == set(plain["history"])
    for key, values in plain["history"].items():
        np.testing.assert_allclose(mine["history"][key], values, **TOLERANCE, err_msg=key)
    for got, expected in zip(mine["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(got, expected, **TOLERANCE)


# Rows a data-parallel fit refuses before training, each with what its message names.
REFUSED = {"optimizer:ScheduleFreeAdamW": "keras.optimizers.ScheduleFreeAdamW"}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_cannot_equal_one_process_is_refused_before_training_naming_it(name, tmp_path):
    with pytest.raises(InputError, match=REFUSED[name]):
        fitted(ROWS[name][0], [], data_parallel=True)


@pytest.mark.parametrize("name", sorted(set(ROWS) - set(REFUSED)))
def test_one_worker_fits_as_plain_keras(name, tmp_path):
    build, make_callbacks = ROWS[name]
    for where in ("plain", "mine"):
        (tmp_path / where).mkdir()
    plain = fitted(build, make_callbacks(tmp_path / "plain"), data_parallel=False)
    mine = fitted(build, make_callbacks(tmp_path / "mine"), data_parallel=True)
    assert_same(mine, plain)
    for got, expected in zip(mine["worker"]["weights"], plain["weights"], strict=True):
        np.testing.assert_allclose(got, expected, **TOLERANCE)  # every rank holds the final model
    rates = [[c.rates for c in result["callbacks"] if isinstance(c, Logged)] for result in (mine, plain)]
    np.testing.assert_allclose(*rates, rtol=1e-6)


class PreemptedAfter(Preemption):
    """A preemption signal that reaches every rank once ``epochs`` epochs trained (each rank asks once an epoch)."""

    epochs = 2

    def install(self, names, grace_seconds, on_expire):  # threads cannot take signals: no handlers
        self.asked = 0

    @property
    def requested(self) -> bool:
        self.asked += 1
        return self.asked >= self.epochs


def test_a_fit_with_backup_and_restore_stopped_mid_way_and_started_again_ends_as_one_uninterrupted_process(
        tmp_path, monkeypatch):
    """As in one process: the second job resumes at the epoch after the last backed-up one, its learning-rate
    schedule on track, and ends with the uninterrupted fit's History and weights; the backup_dir goes at the end."""
    callbacks = lambda: [keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),  # noqa: E731
                         keras.callbacks.LearningRateScheduler(lr_schedule), Logged()]
    plain = fitted(sequential, callbacks(), data_parallel=False)
    with monkeypatch.context() as patched:
        patched.setattr("mpi_trainer.trainer.fit.Preemption", PreemptedAfter)
        with pytest.raises(Preempted):
            fitted(sequential, callbacks(), data_parallel=True)
    assert (tmp_path / "backup" / "checkpoint.h5").exists()
    again = callbacks()
    resumed = fitted(sequential, again, data_parallel=True)
    assert_same(resumed, plain)
    assert again[-1].rates == pytest.approx(plain["callbacks"][-1].rates[PreemptedAfter.epochs:])  # on track
    survived = resumed["summary"]["survived"]
    assert survived == [{"event": "resumed", "round": PreemptedAfter.epochs - 1}]
    assert not (tmp_path / "backup").exists()  # deleted once the fit completed, as Keras deletes it


def test_a_model_keras_will_not_save_ends_its_fit_on_every_rank_with_its_weights_in_the_run_directory(tmp_path):
    from mpi_trainer.persistence.checkpoint import load_checkpoint

    build = MODELS["never_called_by_fit"]
    plain = fitted(build, [], data_parallel=False)
    mine = fitted(build, [], data_parallel=True, run_dir=tmp_path / "run")
    assert_same(mine, plain)
    assert mine["summary"]["final_weights"] == "final.state.h5"
    arrays, meta = load_checkpoint(tmp_path / "run" / "final.state.h5")
    assert len(meta["weights"]) == len(plain["weights"]) and "not yet been built" in meta["keras_refused"]
    for index, expected in enumerate(plain["weights"]):
        np.testing.assert_allclose(arrays[f"weight_{index}"], expected, **TOLERANCE)
    assert not list((tmp_path / "run").glob("*.tmp*"))


# Callbacks whose own state (a wait counter, a best value) a new job starts afresh, as after Keras' own
# BackupAndRestore: a resumed run's later epochs may differ from an uninterrupted one's by design. (Layers that
# draw random numbers go on as uninterrupted: the checkpoint keeps each worker's seed generators.)
RESTARTS_OWN_STATE = {"callback:EarlyStopping", "callback:ReduceLROnPlateau", "callback:ModelCheckpoint",
                      "callback:BackupAndRestore"}


@pytest.mark.parametrize("name", sorted(set(ROWS) - set(REFUSED) - RESTARTS_OWN_STATE))
def test_one_worker_preempted_and_run_again_on_its_run_directory_ends_as_one_uninterrupted_process(
        name, tmp_path, monkeypatch):
    """Each row with a run directory: the job preempted after 2 of its 3 epochs, the same fit started again
    resumes at epoch 2 and ends with the History and weights of plain Keras' uninterrupted fit."""
    build, make_callbacks = ROWS[name]
    for where in ("plain", "first", "again"):
        (tmp_path / where).mkdir()
    plain = fitted(build, make_callbacks(tmp_path / "plain"), data_parallel=False)
    with monkeypatch.context() as patched:
        patched.setattr("mpi_trainer.trainer.fit.Preemption", PreemptedAfter)
        with pytest.raises(Preempted):
            fitted(build, make_callbacks(tmp_path / "first"), data_parallel=True, run_dir=tmp_path / "run")
    callbacks = make_callbacks(tmp_path / "again")
    resumed = fitted(build, callbacks, data_parallel=True, run_dir=tmp_path / "run")
    assert_same(resumed, plain)
    assert resumed["summary"]["resumed_after_round"] == PreemptedAfter.epochs - 1
    for logged, expected in zip([c for c in callbacks if isinstance(c, Logged)],
                                [c for c in plain["callbacks"] if isinstance(c, Logged)], strict=True):
        np.testing.assert_allclose(logged.rates, expected.rates[PreemptedAfter.epochs:], rtol=1e-6)


@pytest.mark.parametrize("callbacks, named", [
    (lambda tmp: [keras.callbacks.BackupAndRestore(str(tmp), save_freq=5)],
     r"BackupAndRestore\(save_freq=5\) backs up within an epoch.*Received: save_freq=5; expected save_freq='epoch'"),
    (lambda tmp: [keras.callbacks.BackupAndRestore(str(tmp / "a")), keras.callbacks.BackupAndRestore(str(tmp / "b"))],
     r"`callbacks` holds 2 BackupAndRestore callbacks"),
])
def test_a_backup_a_data_parallel_fit_cannot_keep_is_refused_before_training(tmp_path, callbacks, named):
    with pytest.raises(InputError, match=named):
        fitted(sequential, callbacks(tmp_path), data_parallel=True)
    assert not list(tmp_path.iterdir())  # nothing written
