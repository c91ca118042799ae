"""What a setting that deals out or counts a worker's rows cannot do with an input of a kind: the one home of
those refusals, for a script's ``x`` (:mod:`mpi_trainer.trainer.fit_input`) and the config's sources read as
pipelines (:mod:`mpi_trainer.data.streamed`) alike.

Each setting needs arrays (or a known number of steps) because it cuts or counts rows: rounds of a few steps,
the data increment's draws, rebalanced blocks and step budgets; the image augmentation transforms one array of
images. A pipeline (a ``tf.data.Dataset``, a ``PyDataset``, a generator, a file read in batches, TFRecords)
trains whole epochs of its own batches, and augments itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpi_trainer.config import Config


def _refusal(key: str, value: Any, why: str, kind: str, steps: int | None, expected: str) -> str:
    return (f"`{key}` {why}. Received: {key}={value!r} with x of kind {kind!r}, steps_per_epoch={steps!r}; "
            f"expected {expected}")


def input_refusals(cfg: Config, kind: str, steps_per_epoch: int | None = None, one_array: bool = True) -> list[str]:
    """Every setting of ``cfg`` an input of ``kind`` (:func:`~mpi_trainer.data.adapters.input_kind`, or a
    source's own) cannot honour, one message each; ``one_array``: arrays given as one array, not a structure."""
    arrays = kind == "arrays" and steps_per_epoch is None  # rows dealt out and walked whole
    train, data, out = cfg.train, cfg.data, []
    rounds = (("train.sync_every", train.sync_steps, "train.sync_every=0"),
              ("train.sync_warmup_every", train.sync_warmup_every if train.sync_warmup_epochs else 0,
               "train.sync_warmup_epochs=0"))
    for key, every, off in rounds:
        if every and not arrays:
            out.append(_refusal(key, every, "combines the workers every few steps of arrays given as `x`; a "
                                "pipeline (or `steps_per_epoch`) trains whole epochs", kind, steps_per_epoch,
                                f"arrays without steps_per_epoch, or {off}"))
    if data.increment.enabled and not arrays:
        out.append(_refusal("data.increment.enabled", True, "adds a draw of the other workers' rows to each "
                            "worker's share every epoch: arrays given as `x`, trained in whole epochs", kind,
                            steps_per_epoch, "arrays and no steps_per_epoch, or data.increment.enabled=false"))
    if data.augmentation.enabled and (kind != "arrays" or not one_array):
        out.append(_refusal("data.augmentation.enabled", True, "transforms each round's images, given as one "
                            "array `x`; a pipeline or a structure of inputs augments itself (Keras' preprocessing "
                            "layers in it or in the model)", kind, steps_per_epoch,
                            "one array of images, or data.augmentation.enabled=false"))
    if data.rebalance and not arrays:
        out.append(_refusal("data.rebalance", True, "sizes each worker's block of the training arrays by its speed, "
                            "an epoch at a time", kind, steps_per_epoch,
                            "arrays and no steps_per_epoch, or data.rebalance=false"))
    if train.max_steps and kind != "arrays" and steps_per_epoch is None:
        out.append(_refusal("train.max_steps", train.max_steps, "deals the steps left to the workers from the "
                            "batches each trains in an epoch", kind, steps_per_epoch,
                            "arrays or steps_per_epoch, or train.max_steps=0"))
    return out
