"""Real-time image augmentation built from Keras preprocessing layers.

Workers pass each round's training images through the pipeline with
``training=True``, so every round sees freshly drawn shifts, rotations, flips
and zooms. Evaluation (the scheduler's test and validation passes, a worker's
best-of scoring) never goes through it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_trainer.config import AugmentationConfig
from mpi_trainer.errors import DataError


def check_image_input(cfg: AugmentationConfig, input_shape: tuple[int, ...]) -> None:
    """Augmentation needs (height, width, channels) inputs; fail before training otherwise."""
    if cfg.enabled and len(input_shape) != 3:
        raise DataError(f"`data.augmentation.enabled` needs image data of shape (height, width, channels). "
                        f"Received: data.augmentation.enabled=True with input shape {input_shape}")


def build_augmenter(cfg: AugmentationConfig, seed: int) -> Any | None:
    """A Keras pipeline of the configured transforms, or None when nothing is enabled."""
    if not cfg.enabled:
        return None
    from keras import Sequential, layers

    transforms = []
    if cfg.shift > 0:
        transforms.append(layers.RandomTranslation(cfg.shift, cfg.shift, fill_mode="nearest", seed=seed))
    if cfg.rotation > 0:
        transforms.append(layers.RandomRotation(cfg.rotation, fill_mode="nearest", seed=seed + 1))
    if cfg.zoom > 0:
        transforms.append(layers.RandomZoom(cfg.zoom, cfg.zoom, fill_mode="nearest", seed=seed + 2))
    if cfg.flips:
        transforms.append(layers.RandomFlip(cfg.flip, seed=seed + 3))
    return Sequential(transforms, name="augmentation") if transforms else None


def augment(x: np.ndarray, augmenter: Any | None, batch_size: int = 256) -> np.ndarray:
    """A freshly transformed copy of ``x`` (the input is left untouched)."""
    if augmenter is None or len(x) == 0:
        return x
    from keras import ops

    parts = [ops.convert_to_numpy(augmenter(x[i:i + batch_size], training=True))
             for i in range(0, len(x), batch_size)]
    return np.concatenate(parts).astype(np.float32, copy=False)
