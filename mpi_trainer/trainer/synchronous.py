"""Synchronous SGD (``aggregation.method = "synchronous"``): a worker's gradients summed with the others' at every
step, inside Keras' own train step, so that every worker applies the same update as one process would on the
global batch.

Separation of concerns: Keras owns the step. The model's own ``train_step`` computes the gradients of its
batch and calls its optimizer's ``apply``; :class:`GradientSum` stands between the two on every worker for the
whole fit. The train step is wrapped to note the batch's rows, and the optimizer's ``apply`` to replace each
worker's gradients by the row-weighted mean of every worker's (``sum(rows_i * g_i) / sum(rows_i)``, the
gradient of the mean loss over the global batch), summed on the host through ``tf.numpy_function`` by the
workers' own communicator (:meth:`~mpi_trainer.comm.interface.RankTransport.split_workers`). Then the script's
optimizer applies it: clipping, weight decay, loss scaling, accumulation and the EMA run as Keras runs them, on
the same numbers on every worker. A worker whose share ran out of batches before the others' joins their
remaining sums with nothing (:meth:`GradientSum.drain`), so an epoch's last steps are those of one process whose
last batch is smaller. The scheduler's round at the epoch's end keeps the state of a worker that took every
step (they all hold the same one).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from mpi_trainer.errors import ConfigError

if TYPE_CHECKING:
    from mpi_trainer.comm.interface import RankTransport


def synchronous_refusal(model: Any) -> str | None:
    """Why this model cannot train by synchronous SGD here (None: it can)."""
    import keras

    from mpi_trainer.launch.runtime import JAX_CALLBACK_CORES, usable_cores
    from mpi_trainer.trainer.state import model_optimizers

    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        return (f"`aggregation.method` = 'synchronous' sums the gradients inside the compiled step of TensorFlow "
                f"or JAX. Received: KERAS_BACKEND={backend!r}; expected 'tensorflow' or 'jax', or another "
                f"aggregation.method")
    cores = usable_cores()
    if backend == "jax" and cores is not None and cores < JAX_CALLBACK_CORES:
        return (f"`aggregation.method` = 'synchronous' on JAX sums the gradients through a host callback, which "
                f"takes a thread of JAX's CPU client besides the step's; the client has one thread a core this "
                f"process may use, and on one core the two wait on each other for good. Received: this rank may "
                f"use {cores} core; expected at least {JAX_CALLBACK_CORES} (mpirun's --bind-to none, or "
                f"train.bind_cores = false where the script's own fit() asks for synchronous SGD)")
    optimizers = model_optimizers(model)
    if len(optimizers) != 1:
        names = [type(optimizer).__name__ for optimizer in optimizers]
        return (f"`aggregation.method` = 'synchronous' sums the gradients that model.optimizer applies, and this "
                f"model trains with {len(optimizers)} optimizers ({', '.join(names) or 'none'}); their "
                f"gradients would go unsummed. Received: optimizers {names}; expected one (model.optimizer), or "
                f"aggregation.method = 'average'")
    return None


class GradientSum:
    """One worker's side of the per-step sum (see the module docstring)."""

    def __init__(self, workers: RankTransport, model: Any) -> None:
        self.workers, self.model = workers, model
        self.buffer = np.zeros(2, np.float32)
        self.rows: Any = None  # a tf.Variable: the rows of the batch the train step is on
        self.sums = 0  # the sums this worker took part in, in the whole fit

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The model's train step and its optimizer's update wrapped for the fit, on the backend's terms."""
        import keras

        # the sums' size before any step (a worker whose share has no batch left joins with this many zeros)
        self.buffer = np.zeros(sum(int(np.prod(v.shape)) for v in self.model.trainable_variables) + 2, np.float32)
        with self._on_jax() if keras.backend.backend() == "jax" else self._on_tensorflow():
            yield

    @contextmanager
    def _on_jax(self) -> Iterator[None]:
        """JAX: ``train_step(state, data)`` notes its batch's rows (a static shape while it is traced) and the
        optimizer's ``stateless_apply`` takes the summed gradients, through an ordered ``io_callback``."""
        import jax

        model, optimizer = self.model, self.model.optimizer
        own_step, own_apply = model.train_step, optimizer.stateless_apply
        traced = {"rows": 0}

        def train_step(state: Any, data: Any) -> Any:
            traced["rows"] = int(jax.tree_util.tree_leaves(data)[0].shape[0])
            return own_step(state, data)

        def stateless_apply(optimizer_variables: Any, grads: Any, trainable_variables: Any) -> Any:
            return own_apply(optimizer_variables, self.summed_jax(list(grads), traced["rows"]), trainable_variables)

        model.train_step, optimizer.stateless_apply, model.train_function = train_step, stateless_apply, None
        try:
            yield
        finally:
            del model.train_step, optimizer.stateless_apply
            model.train_function = None

    def summed_jax(self, grads: list[Any], rows: int) -> list[Any]:
        """Every worker's gradients, the row-weighted mean (in the traced step; ``rows``: this batch's)."""
        import jax
        import jax.numpy as jnp
        from jax.experimental import io_callback

        flat = jnp.concatenate([jnp.ravel(grad).astype(jnp.float32) for grad in grads])
        mean = io_callback(lambda values: self.host_sum(np.asarray(values), float(rows)),
                           jax.ShapeDtypeStruct(flat.shape, jnp.float32), flat, ordered=True)
        ends = np.cumsum([int(np.prod(grad.shape)) for grad in grads])
        return [jnp.reshape(mean[end - grad.size:end], grad.shape).astype(grad.dtype)
                for grad, end in zip(grads, ends)]

    @contextmanager
    def _on_tensorflow(self) -> Iterator[None]:
        """TensorFlow: the train step notes its batch's rows in a variable and the optimizer's ``apply`` takes the
        summed gradients, through ``tf.numpy_function``; the compiled step made again, without XLA (the sum runs
        on the host)."""
        import tensorflow as tf

        model, optimizer = self.model, self.model.optimizer
        self.rows = tf.Variable(0.0, trainable=False, dtype=tf.float32)
        own_step, own_apply, jit = model.train_step, optimizer.apply, model.jit_compile

        def train_step(data: Any) -> Any:
            first = tf.nest.flatten(data)[0]
            self.rows.assign(tf.cast(tf.shape(first)[0], tf.float32))
            return own_step(data)

        def apply(grads: Any, trainable_variables: Any = None) -> Any:
            return own_apply(self.summed(list(grads)), trainable_variables)

        model.train_step, optimizer.apply = train_step, apply
        model.jit_compile, model.train_function = False, None
        try:
            yield
        finally:
            del model.train_step, optimizer.apply
            model.jit_compile, model.train_function = jit, None

    def summed(self, grads: list[Any]) -> list[Any]:
        """Every worker's gradients, the row-weighted mean (in TensorFlow's compiled step)."""
        import tensorflow as tf

        present = [index for index, grad in enumerate(grads) if grad is not None]
        dense = [tf.convert_to_tensor(grads[index]) for index in present]
        flat = tf.concat([tf.reshape(tf.cast(grad, tf.float32), [-1]) for grad in dense], axis=0)
        mean = tf.numpy_function(self.host_sum, [flat, self.rows.read_value()], tf.float32, stateful=True)
        mean = tf.ensure_shape(mean, flat.shape)
        parts = tf.split(mean, [int(np.prod(grad.shape)) for grad in dense], axis=0)
        out = list(grads)
        for index, grad, part in zip(present, dense, parts):
            out[index] = tf.cast(tf.reshape(part, tf.shape(grad)), grad.dtype)
        return out

    def host_sum(self, flat: np.ndarray, rows: float | np.ndarray) -> np.ndarray:
        """``sum(rows_i * g_i) / sum(rows_i)`` over the workers stepping now (on the host)."""
        size = flat.size
        if self.buffer.size != size + 2:
            self.buffer = np.zeros(size + 2, np.float32)
        np.multiply(flat, np.float32(rows), out=self.buffer[:size])
        self.buffer[size], self.buffer[size + 1] = rows, 1.0  # the rows, and one worker stepping
        self.workers.reduce_broadcast(self.buffer, root=0)
        self.sums += 1
        mean: np.ndarray = self.buffer[:size] / self.buffer[size]
        return mean

    def drain(self) -> None:
        """After this worker's fit: join the others' sums with nothing until no worker steps any more (every
        worker ends here, in the same sum)."""
        while True:
            self.buffer[:] = 0.0
            self.workers.reduce_broadcast(self.buffer, root=0)
            self.sums += 1
            if self.buffer[-1] == 0.0:
                return

    def keeps(self, batches: int) -> bool:
        """Whether this worker's state is the epoch's: the first of those that took the most steps."""
        counts = self.workers.allgather(batches)
        return counts.index(max(counts)) == self.workers.rank


def check_synchronous(model: Any) -> None:
    """Refuse, before training, a model synchronous SGD cannot train (:func:`synchronous_refusal`)."""
    refused = synchronous_refusal(model)
    if refused:
        raise ConfigError(refused)
