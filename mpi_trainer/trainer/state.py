"""A Keras model's training state, laid out for a round: what moves, and how each part is combined.

A round moves everything training changes, and combines each part by its meaning: what one
process would hold after training on every worker's batches of the round.

* **trainable weights** (``model.trainable_weights``): averaged over the workers (by rows when
  ``aggregation.method = "weighted"``), then stepped by the outer optimizer. They lead the flat
  buffer, so the outer step works on one prefix;
* **moving averages** (``BatchNormalization``'s moving mean and variance; an optimizer's moments:
  Adam's, Nadam's, Lamb's and AdamW's ``beta_1``/``beta_2`` averages, RMSprop's and Adadelta's
  ``rho`` averages, SGD's, RMSprop's and Lion's momentum, the optimizer's own EMA of the weights):
  combined as one process holds them after all the workers' updates
  (:mod:`~mpi_trainer.algorithms.moving_averages`), never stepped. A layer's averages count the
  model's training steps (the batches ``fit`` ran, one update each); an optimizer's count its own
  steps (its ``iterations``), so an optimizer that did not step leaves its averages as they were;
* **running sums** (Adagrad's accumulators): the start plus every worker's additions;
* **other floating-point state** (an adapted ``Normalization``'s statistics, AMSGrad's maxima, a
  ``LossScaleOptimizer``'s scale, optimizers this module does not know): averaged plainly. The
  learning rate is the scheduler's (its callbacks may set it), not averaged;
* **step counters**: each optimizer's ``iterations`` becomes the start plus every worker's steps,
  as one process counts them (a learning-rate schedule advances by the steps of the whole round);
  other integer state takes the first worker's values.

Random seeds and metric state are not combined: each rank keeps its own (each worker's seed generators
start from the script's seed with the worker's index folded in, :func:`separate_random_streams`). A
worker's seed generators' states ride in its reports to rank 0, so that a checkpoint keeps them and a
resumed run's workers draw on where they left off (:meth:`ModelState.read_seeds`).
Layer state that is not a variable (an adapted ``TextVectorization``'s vocabulary) is already the
same on every rank, since every rank ran the script that adapted it.

The optimizers are ``model.optimizer`` and every other optimizer the model or one of its layers
holds as an attribute (a GAN's ``d_optimizer`` and ``g_optimizer``), in the order of their
attribute names. Each is built for all the model's trainable variables before the first round
(:func:`build_optimizers`), so one first built inside a custom ``train_step`` has its moments on
every rank from the start and combines like ``model.optimizer``'s.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from mpi_trainer.algorithms import moving_averages

MEAN, MOVING, SUM = "mean", "moving", "sum"
MODEL_STEPS = 0  # the clock of a layer's moving averages: the batches the worker trained


@dataclass(frozen=True)
class Rule:
    """How one variable combines: ``kind`` (mean, moving average or running sum), the average's
    ``decay``, and the ``clock`` counting its updates (0: the model's steps; ``i + 1``: optimizer i's
    calls). ``per``: the clock's ticks per update (an optimizer with ``gradient_accumulation_steps = k``
    is called every batch but moves its averages every k-th call)."""

    kind: str = MEAN
    decay: float = 0.0
    clock: int = MODEL_STEPS
    per: int = 1

    def updates(self, steps: Any) -> int:
        """The updates of this variable in ``steps`` (each clock's ticks)."""
        return int(steps[self.clock]) // self.per


def step_counter(optimizer: Any) -> Any:
    """The variable counting an optimizer's calls: ``iterations``, or under ``gradient_accumulation_steps``
    the raw counter Keras divides to give it (``iterations`` is then a computed tensor, not a variable)."""
    holder = getattr(optimizer, "inner_optimizer", None) or optimizer  # a LossScaleOptimizer counts its inner's
    counter = getattr(holder, "_iterations", None)
    return holder.iterations if counter is None else counter


def accumulation(optimizer: Any) -> int:
    """The calls an optimizer takes per update of its weights (``gradient_accumulation_steps``; 1 without)."""
    holder = getattr(optimizer, "inner_optimizer", None) or optimizer
    return int(getattr(holder, "gradient_accumulation_steps", None) or 1)


@contextmanager
def finalization_held(model: Any) -> Iterator[None]:
    """A worker's ``model.fit`` for one round without the end that Keras gives every ``fit``: with
    ``use_ema``, ``optimizer.finalize_variable_values`` writes the EMA into the weights. One process does
    that once, at the end of the whole fit (:func:`finalize`), so a round's end must not."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "use_ema", False):
        yield
        return
    optimizer.finalize_variable_values = lambda var_list: None  # an instance attribute shadows the method
    try:
        yield
    finally:
        del optimizer.finalize_variable_values


SEED_STRIDE = 1_000_003  # between two workers' seeds: a prime, far from the small seeds scripts set


def seed_states(model: Any) -> list[Any]:
    """The state variables of the model's seed generators (Dropout's, GaussianNoise's, ...): each rank's own,
    never combined; a worker's travel in its reports so that a checkpoint keeps them."""
    return [variable for variable in model.variables if variable.path.endswith("seed_generator_state")]


def separate_random_streams(model: Any, worker_index: int) -> int:
    """Worker ``worker_index`` (0 for the first) draws its own random numbers: each of the model's seed
    generators (Dropout's, GaussianNoise's, ...) has the worker's index folded into its seed. Every rank ran
    the script's ``keras.utils.set_random_seed``, so without this every worker would draw the same masks at
    the same step, where one process training on all their batches draws a mask for each. The first worker
    keeps the script's streams, so one worker draws exactly what plain Keras draws. Returns the generators."""
    import keras

    states = seed_states(model)
    if worker_index:
        for variable in states:
            value = np.array(keras.ops.convert_to_numpy(variable.value))
            value[0] = (int(value[0]) + SEED_STRIDE * worker_index) % (1 << 31)
            variable.assign(value.astype(value.dtype))
    return len(states)


def finalize(model: Any) -> None:
    """What Keras' ``fit`` does when it ends (``optimizer.finalize_variable_values``, with ``use_ema`` the
    EMA written into the weights), once for the whole data-parallel fit, on every rank."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and getattr(optimizer, "built", False):
        optimizer.finalize_variable_values(model.trainable_weights)


def model_optimizers(model: Any) -> list[Any]:
    """The optimizers a model trains with: ``model.optimizer`` first, then optimizer attributes of the
    model and of its layers, by attribute name."""
    import keras

    found: list[Any] = []
    candidates = [getattr(model, "optimizer", None)]
    for layer in [model, *model._flatten_layers(include_self=False)]:
        candidates += [value for _, value in sorted(vars(layer).items())
                       if isinstance(value, keras.optimizers.Optimizer)]
    for optimizer in candidates:
        if optimizer is not None and all(optimizer is not seen for seen in found):
            found.append(optimizer)
    return found


def build_optimizers(model: Any) -> None:
    """Build every optimizer for the model's trainable variables, as its first training step would."""
    for optimizer in model_optimizers(model):
        if not optimizer.built:
            optimizer.build(model.trainable_variables)


def _slot_decays(optimizer: Any) -> dict[str, str]:
    """The optimizer's per-variable moving averages: attribute holding the slots -> attribute holding
    the decay (``SUM`` for a running sum). Keras' own optimizers only: another's slots average plainly."""
    import keras

    opt = keras.optimizers
    known: list[tuple[Any, dict[str, str]]] = [
        # ScheduleFreeAdamW's "momentum" is the z sequence (a position, averaged plainly), its velocity Adam's
        (getattr(opt, "ScheduleFreeAdamW", ()), {"_velocities": "beta_2"}),
        (opt.RMSprop, {"_velocities": "rho", "_average_gradients": "rho", "_momentums": "momentum"}),
        (opt.Lion, {"_momentums": "beta_2"}),
        (opt.Adamax, {"_m": "beta_1"}),
        (opt.Adadelta, {"_accumulated_grads": "rho", "_accumulated_delta_vars": "rho"}),
        (opt.SGD, {"momentums": "momentum"}),
        ((opt.Adam, opt.Nadam, opt.Lamb), {"_momentums": "beta_1", "_velocities": "beta_2"}),
        (opt.Adagrad, {"_accumulators": SUM}),
    ]
    return next((slots for kind, slots in known if isinstance(optimizer, kind)), {})


def _decay(holder: Any, name: str) -> float | None:
    try:
        value = float(getattr(holder, name))
    except (AttributeError, TypeError, ValueError):  # a callable or tensor decay: averaged plainly
        return None
    return value if 0.0 <= value < 1.0 else None


def optimizer_rules(optimizer: Any, clock: int) -> dict[int, Rule]:
    """The rules of an optimizer's variables it keeps moving averages or sums in, by variable id."""
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer  # a LossScaleOptimizer's moments
    per = accumulation(optimizer)
    rules: dict[int, Rule] = {}
    for slots, decay_name in _slot_decays(inner).items():
        decay = 0.0 if decay_name == SUM else _decay(inner, decay_name)
        for variable in getattr(inner, slots, None) or []:
            if decay is not None and variable is not None:
                rules[id(variable)] = Rule(SUM if decay_name == SUM else MOVING, decay, clock, per)
    if getattr(inner, "use_ema", False):
        decay = _decay(inner, "ema_momentum")
        for variable in getattr(inner, "_model_variables_moving_average", None) or []:
            if decay is not None and variable is not None:  # moved on every call, accumulating or not
                rules[id(variable)] = Rule(MOVING, decay, clock)
    return rules


def batchnorm_layers(model: Any) -> list[Any]:
    """The model's BatchNormalization layers: their moving statistics follow the weights."""
    import keras

    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.BatchNormalization)]


def layer_rules(model: Any) -> dict[int, Rule]:
    """BatchNormalization's moving mean and variance, updated once per training step with its momentum."""
    rules: dict[int, Rule] = {}
    for layer in batchnorm_layers(model):
        decay = _decay(layer, "momentum")
        if decay is not None:
            for variable in (layer.moving_mean, layer.moving_variance):
                rules[id(variable)] = Rule(MOVING, decay, MODEL_STEPS)
    return rules


def _is_float(variable: Any) -> bool:
    import keras

    return "float" in keras.backend.standardize_dtype(variable.dtype)


def _value(variable: Any) -> np.ndarray:
    """A copy of the variable's value."""
    import keras

    return np.array(keras.ops.convert_to_numpy(variable.value))


def _view(variable: Any) -> np.ndarray:
    """The variable's value to read at once, without a copy where the backend allows it: a TensorFlow
    variable's buffer (copied on write, so an update after this leaves the view as it was), a JAX array on
    the CPU. Read-only."""
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow":
        return np.asarray(variable.value.read_value())
    if backend == "jax":
        return np.asarray(variable.value)
    return np.asarray(keras.ops.convert_to_numpy(variable.value))


COMPARED = 1 << 18  # values compared at a time: their comparison's booleans stay in cache
ALIGN = 128  # bytes: TensorFlow's kernels need a tensor's buffer aligned (64 with AVX-512), and so more is safe
SPARE_BUFFERS = 2  # per variable: the one a variable holds, and the one the next write fills
FREE_REFERENCES = 2  # sys.getrefcount of a buffer only the pool's list holds (the list, and the call's argument)


def _aligned_empty(shape: tuple[int, ...]) -> np.ndarray:
    """A new float32 array of ``shape``, its buffer aligned to :data:`ALIGN` bytes."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * 4
    raw = np.empty(nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(np.float32).reshape(shape)


class HandedBuffers:
    """Aligned float32 buffers handed to TensorFlow variables through DLPack, each variable's kept to fill
    again once the variable has let go of it (a later write handed it another).

    ``variable.assign`` of a NumPy array converts it at a fraction of memory speed (49 MB: 46 ms against
    8 ms for a copy); a tensor made from a buffer through DLPack is taken by the variable as its own, so a
    write is one copy. A new buffer of a model's size costs its page faults each round (2-3 times the copy),
    so each variable's last :data:`SPARE_BUFFERS` are filled again instead: a buffer is free when nothing
    but this pool refers to it (the variable's tensor, and any read of it, hold a reference through DLPack)."""

    def __init__(self) -> None:
        self.kept: dict[int, list[np.ndarray]] = {}

    def fill(self, index: int, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """A buffer of ``shape`` holding ``values`` for variable ``index`` to take, that nothing else holds."""
        kept = self.kept.setdefault(index, [])
        free = next((i for i in range(len(kept)) if sys.getrefcount(kept[i]) <= FREE_REFERENCES), None)
        if free is None:
            buffer = _aligned_empty(shape)
            if len(kept) < SPARE_BUFFERS:
                kept.append(buffer)
        else:
            buffer = kept[free]
        np.copyto(buffer, values.reshape(shape))
        return buffer

    def reserve(self, index: int, shape: tuple[int, ...]) -> None:
        """Variable ``index``'s :data:`SPARE_BUFFERS` made now, their pages touched: a first write into a new
        buffer costs its page faults (on a node whose memory is fragmented, 30 times the copy, as the kernel
        compacts memory into the huge pages NumPy asks for)."""
        kept = self.kept.setdefault(index, [])
        while len(kept) < SPARE_BUFFERS:
            buffer = _aligned_empty(shape)
            buffer.fill(0.0)
            kept.append(buffer)


def _handed(variable: Any) -> bool:
    """Whether a write reaches ``variable`` through a buffer handed over by DLPack (a TensorFlow float32 one)."""
    import keras

    dtype = keras.backend.standardize_dtype(variable.dtype)
    return bool(keras.backend.backend() == "tensorflow" and dtype == "float32")


def _assign(variable: Any, values: np.ndarray, buffers: HandedBuffers, index: int) -> None:
    """Set the variable from float32 ``values`` (flat): on TensorFlow through a buffer of ``buffers`` handed
    over by DLPack (one copy, :class:`HandedBuffers`); elsewhere by ``assign`` of a copy (JAX on the CPU may
    keep the very array it is given, which is the caller's)."""
    shape = tuple(variable.shape)
    if _handed(variable):
        import tensorflow as tf

        variable.assign(tf.experimental.dlpack.from_dlpack(buffers.fill(index, values, shape).__dlpack__()))
        return
    variable.assign(np.array(values.reshape(shape), dtype=variable.dtype))  # a copy: JAX may alias an array


class ModelState:
    """The model's state as one flat float32 vector (trainable first) plus a list of integer arrays, and
    the rule each variable combines by."""

    def __init__(self, model: Any, local_optimizer_state: bool = False) -> None:
        """``local_optimizer_state`` (``aggregation.optimizer_state = "local"``): the optimizers' moments and
        other slots are left out, each worker keeping its own; their step counts, learning rates and EMA stay."""
        self.optimizers = model_optimizers(model)
        weights = list(model.weights)
        trainable_ids = {id(v) for v in model.trainable_weights}
        trainable = [v for v in weights if id(v) in trainable_ids and _is_float(v)]
        other = [v for v in weights if id(v) not in trainable_ids and _is_float(v)]
        optimizer_vars = [v for opt in self.optimizers for v in opt.variables]
        self.rates = [id(v) for opt in self.optimizers for v in _rate_variables(opt)]
        self.local_optimizer_state = local_optimizer_state
        if local_optimizer_state:
            shared = set(self.rates) | {id(v) for opt in self.optimizers for v in _ema_variables(opt)}
            optimizer_vars = [v for v in optimizer_vars if not _is_float(v) or id(v) in shared]
        self.floats = trainable + other + [v for v in optimizer_vars if _is_float(v)]
        self.integers = [v for v in weights + optimizer_vars if not _is_float(v)]
        self.sizes = [int(np.prod(v.shape)) for v in self.floats]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.size = int(self.offsets[-1])
        self.trainable_size = int(sum(self.sizes[:len(trainable)]))
        self.trainable = trainable  # the trainable variables, in the state's order (first)
        self.seeds = seed_states(model)  # the seed generators' states: each worker's own (read_seeds)
        self.model_size = int(sum(self.sizes[:len(trainable) + len(other)]))  # the model's, before its optimizers'
        self.nbytes = self.size * 4  # the floating-point state as it travels (float32)
        self.handed = HandedBuffers()  # the buffers :meth:`write` hands the variables (TensorFlow)
        self._rate_spans = [(int(self.offsets[i]), int(self.offsets[i + 1])) for i, v in enumerate(self.floats)
                            if id(v) in self.rates]
        rules = layer_rules(model)
        for index, optimizer in enumerate(self.optimizers):
            rules.update(optimizer_rules(optimizer, index + 1))
        self.rules = [rules.get(id(v), Rule()) for v in self.floats]
        self.clocks = 1 + len(self.optimizers)  # the model's steps, then each optimizer's
        integer_ids = [id(v) for v in self.integers]
        counters = [id(step_counter(opt)) for opt in self.optimizers]
        self.counters = {integer_ids.index(counter): index + 1 for index, counter in enumerate(counters)
                         if counter in integer_ids}  # integer index -> the optimizer's clock

    def empty(self) -> np.ndarray:
        return np.zeros(self.size, dtype=np.float32)

    def read(self, out: np.ndarray) -> np.ndarray:
        """The model's floating-point state, written into ``out``."""
        for variable, start, end in zip(self.floats, self.offsets[:-1], self.offsets[1:]):
            out[start:end] = _view(variable).reshape(-1)
        return out

    def holds(self, flat: np.ndarray) -> bool:
        """Whether the model's floating-point state is ``flat``, value for value (NaN never is), read in place:
        :data:`COMPARED` values at a time, no copy of the state."""
        for variable, start in zip(self.floats, self.offsets[:-1]):
            own = _view(variable).reshape(-1)
            ends = [(begin, min(begin + COMPARED, own.size)) for begin in range(0, own.size, COMPARED)]
            if not all(np.array_equal(own[begin:stop], flat[start + begin:start + stop]) for begin, stop in ends):
                return False
        return True

    def write(self, flat: np.ndarray) -> None:
        """Assign the floating-point state from ``flat`` (which the variables do not keep)."""
        self.arriving(flat)(0, self.size)

    def arriving(self, flat: np.ndarray) -> ArrivingWrite:
        """A write of the state arriving in ``flat`` part by part, in order (:class:`ArrivingWrite`)."""
        return ArrivingWrite(self, flat)

    def prepare_writes(self) -> None:
        """Make the buffers later writes fill (:meth:`HandedBuffers.reserve`), the state left as it is: each
        variable takes one holding its own value, and the next is made. For a rank that writes its model
        seldom, which otherwise pays the page faults of each new buffer in its first writes, during rounds."""
        for index, variable in enumerate(self.floats):
            if _handed(variable):
                _assign(variable, _view(variable).reshape(-1), self.handed, index)
                self.handed.reserve(index, tuple(variable.shape))

    def read_trainable(self) -> np.ndarray:
        """The trainable variables' values, the state's first :attr:`trainable_size`, as float64 (L-BFGS's
        parameters)."""
        out = np.empty(self.trainable_size, dtype=np.float64)
        for variable, start, end in zip(self.trainable, self.offsets[:-1], self.offsets[1:]):
            out[start:end] = _view(variable).reshape(-1)
        return out

    def write_trainable(self, values: np.ndarray) -> None:
        """Assign the trainable variables from ``values`` (:meth:`read_trainable`'s layout), the rest of the
        state left as it is."""
        if values.size != self.trainable_size:
            raise ValueError(f"expected {self.trainable_size} trainable values, received {values.size}")
        self.arriving(np.asarray(values, dtype=np.float32))(0, self.trainable_size)

    def read_seeds(self) -> list[np.ndarray]:
        """This rank's seed generators' states (a worker's after its epoch, for the checkpoint)."""
        return [np.array(_value(variable)) for variable in self.seeds]

    def write_seeds(self, values: list[np.ndarray]) -> None:
        """Set this rank's seed generators' states (a resumed run's worker, as the checkpoint kept them)."""
        for variable, value in zip(self.seeds, values, strict=True):
            variable.assign(np.asarray(value, dtype=variable.dtype).reshape(variable.shape))

    def read_integers(self) -> list[np.ndarray]:
        return [_value(v) for v in self.integers]

    def write_integers(self, values: list[np.ndarray]) -> None:
        for variable, value in zip(self.integers, values):
            variable.assign(np.asarray(value, dtype=variable.dtype).reshape(variable.shape))

    def optimizer_steps(self) -> list[int]:
        """Each optimizer's calls so far (its step counter: under ``gradient_accumulation_steps``, the calls,
        of which every k-th updates the weights)."""
        return [int(_value(step_counter(optimizer))) for optimizer in self.optimizers]

    def contribute(self, flat: np.ndarray, weight: float, steps: list[int]) -> None:
        """A worker's part of the round's sum, in place: ``flat`` holds the state the round started from
        and becomes the model's state, each variable as its rule sends it (``steps``: the count of each
        clock this round)."""
        for variable, rule, start, end in zip(self.floats, self.rules, self.offsets[:-1], self.offsets[1:]):
            final = _view(variable).reshape(-1)
            if rule.kind == MEAN:
                np.multiply(final, np.float32(weight), out=flat[start:end], casting="unsafe")
            elif rule.kind == SUM:
                moving_averages.sum_contribution(final, flat[start:end])
            else:
                moving_averages.contribution(final, flat[start:end], rule.updates(steps), rule.decay)

    def combine(self, summed: np.ndarray, before: np.ndarray, total_weight: float, steps: np.ndarray,
                start: int = 0, stop: int | None = None) -> None:
        """Rank 0, in place: the workers' contributions added up become the combined state (``before``:
        the state the round started from; ``steps``: each clock's total over the workers). Positions
        ``[start, stop)`` only (default: all), so that a round's sum is combined part by part as it arrives."""
        stop = self.size if stop is None else stop
        first = max(0, int(np.searchsorted(self.offsets, start, side="right")) - 1)
        for index in range(first, len(self.rules)):
            begin, end = max(int(self.offsets[index]), start), min(int(self.offsets[index + 1]), stop)
            if begin >= stop:
                break
            if begin >= end:
                continue
            rule, part = self.rules[index], summed[begin:end]
            if rule.kind == MEAN:
                part /= np.float32(total_weight)
            elif rule.kind == SUM:
                moving_averages.sum_combine(part, before[begin:end])
            else:
                moving_averages.combine(part, before[begin:end], rule.updates(steps), rule.decay)

    def merge(self, into: np.ndarray, local: np.ndarray, base: np.ndarray, share: float, steps: list[int]) -> None:
        """SSP, in place: one worker's update merged into the global state ``into`` as it arrives (``base``:
        the state it started from, ``local``: where it ended, ``steps``: its count of each clock). A mean
        takes ``share`` of the worker's change, a running sum all of it, a moving average the worker's
        steps applied to the global one (:func:`~mpi_trainer.algorithms.moving_averages.merge_update`)."""
        for rule, start, end in zip(self.rules, self.offsets[:-1], self.offsets[1:]):
            part, mine, began = into[start:end], local[start:end], base[start:end]
            if rule.kind == MEAN:
                part += np.float32(share) * (mine - began)
            elif rule.kind == SUM:
                moving_averages.sum_merge(part, mine, began)
            else:
                moving_averages.merge_update(part, mine, began, rule.updates(steps), rule.decay)

    def combine_integers(self, before: list[np.ndarray], first_worker: list[np.ndarray],
                         steps: np.ndarray) -> list[np.ndarray]:
        """Each optimizer's step count advanced by every worker's steps; other integers the first worker's."""
        return [before[index] + int(steps[self.counters[index]]) if index in self.counters else value
                for index, value in enumerate(first_worker)]

    def keep_rates(self, combined: np.ndarray, own: np.ndarray, start: int = 0, stop: int | None = None) -> None:
        """The learning rates in ``combined`` are put back to ``own``'s (the scheduler's); those at positions
        ``[start, stop)`` only (default: all), as :meth:`combine`."""
        stop = self.size if stop is None else stop
        for begin, end in self._rate_spans:
            begin, end = max(begin, start), min(end, stop)
            if begin < end:
                combined[begin:end] = own[begin:end]

    def read_rates(self, out: np.ndarray) -> None:
        """The learning rates the model's optimizers hold now, written at their positions in ``out``."""
        for begin, end in self._rate_spans:
            rate = next(variable for variable, start in zip(self.floats, self.offsets[:-1]) if start == begin)
            out[begin:end] = _view(rate).reshape(-1)

    def halve_rates(self) -> list[float]:
        """Halve each optimizer's learning rate held in a variable (a schedule's stays); the new rates."""
        halved = []
        for optimizer in self.optimizers:
            for rate in _rate_variables(optimizer):
                value = float(_value(rate)) / 2
                rate.assign(value)
                halved.append(value)
        return halved

    def swap_ema(self, flat: np.ndarray) -> None:
        """In ``flat`` (a read of the state), each trainable weight and the optimizer's EMA of it swap places,
        as ``keras.callbacks.SwapEMAWeights`` swaps the variables."""
        index = {id(variable): i for i, variable in enumerate(self.floats)}
        for optimizer in self.optimizers:
            inner = getattr(optimizer, "inner_optimizer", None) or optimizer
            averages = getattr(inner, "_model_variables_moving_average", None) or []
            for weight, average in zip(getattr(inner, "_trainable_variables", None) or [], averages):
                if average is None or id(weight) not in index or id(average) not in index:
                    continue
                one, other = index[id(weight)], index[id(average)]
                first = slice(int(self.offsets[one]), int(self.offsets[one + 1]))
                second = slice(int(self.offsets[other]), int(self.offsets[other + 1]))
                flat[first], flat[second] = flat[second].copy(), flat[first].copy()

    def describe(self) -> str:
        mib = self.size * 4 / 2**20
        moving = sum(size for size, rule in zip(self.sizes, self.rules) if rule.kind != MEAN)
        kept = "; each worker keeps its optimizers' moments (aggregation.optimizer_state = 'local')" \
            if self.local_optimizer_state else ""
        return (f"{len(self.floats)} floating-point variables ({self.size:,} values, {mib:.2f} MiB, "
                f"{self.trainable_size:,} trainable, {moving:,} in moving averages or sums), "
                f"{len(self.integers)} integer variables, {len(self.optimizers)} optimizer(s){kept}")


class ArrivingWrite:
    """The model's state written from ``flat`` as it arrives there part by part, in order (a round's combined
    state coming back with the sum): called with each part's ``(start, stop)``, it assigns every variable whose
    values are all in by then, as :meth:`ModelState.write` does, so that a worker writes its model while the
    later parts are summed instead of after the last."""

    def __init__(self, state: ModelState, flat: np.ndarray) -> None:
        self.state, self.flat, self.written = state, flat, 0  # written: the variables assigned so far

    def __call__(self, start: int, stop: int) -> None:
        state, offsets = self.state, self.state.offsets
        while self.written < len(state.floats) and offsets[self.written + 1] <= stop:
            index = self.written
            _assign(state.floats[index], self.flat[offsets[index]:offsets[index + 1]], state.handed, index)
            self.written += 1


def _ema_variables(optimizer: Any) -> list[Any]:
    """An optimizer's EMA of the model's weights (``use_ema``): the model's state, written into it at the end."""
    inner = getattr(optimizer, "inner_optimizer", None) or optimizer
    return [v for v in getattr(inner, "_model_variables_moving_average", None) or [] if v is not None]


def _rate_variables(optimizer: Any) -> list[Any]:
    """The variables holding an optimizer's learning rate (none when it is a schedule)."""
    found = []
    for holder in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        rate = getattr(holder, "_learning_rate", None)
        if rate is not None and hasattr(rate, "assign"):
            found.append(rate)
    return found
