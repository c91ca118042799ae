"""Where a worker's training rows come from: the shared file, or the scheduler over MPI.

``shared``: every worker opens the same file and reads only its block's rows
(h5py slicing, memory-mapped ``.npz``); nothing but the block plan travels.
``scatter``: the scheduler reads the training rows and sends each worker
the rows it will use, in chunks below MPI's 2 GiB message limit, once at
set-up; with random data increment that is the union of its fixed block and
every draw it will make, which the scheduler can predict from the seed.

:class:`WorkerData` then serves each round's arrays: the fixed block, plus
the round's random draw, passed through real-time augmentation if enabled.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mpi_trainer.comm import TAG_DATA
from mpi_trainer.config import Config
from mpi_trainer.data.augmentation import augment, build_augmenter
from mpi_trainer.data.increment import draw_extra, extra_count, positions_needed, share_line
from mpi_trainer.data.partition import shuffled_order
from mpi_trainer.data.sources import Dataset, validation_only
from mpi_trainer.logs import get_logger


class RowSource(Protocol):
    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


@dataclass
class HeldRows:
    """Training rows a worker received from the scheduler, keyed by sorted training position."""

    positions: np.ndarray
    x: np.ndarray
    y: np.ndarray

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.searchsorted(self.positions, positions)
        index = np.minimum(index, len(self.positions) - 1)
        if not np.array_equal(self.positions[index], positions):
            raise RuntimeError("a worker asked for training rows the scheduler did not send it")
        return self.x[index], self.y[index]


def fixed_positions(plan: Any, rank: int) -> np.ndarray:
    """A worker's fixed block: its slice of the seeded shuffle, in increasing order."""
    start, end = plan.block_bounds[rank - 1]
    return np.sort(shuffled_order(plan.num_train, plan.shuffle_seed)[start:end])


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class WorkerData:
    """One worker's training arrays, round by round."""

    def __init__(self, source: RowSource, plan: Any, rank: int, cfg: Config) -> None:
        self.source = source
        self.rank = rank
        self.total = plan.num_train
        self.increment = cfg.data.increment
        self.seed = cfg.train.seed
        self.shuffle_seed = plan.shuffle_seed
        self.block_sizes = [end - start for start, end in plan.block_bounds]
        self.fixed = fixed_positions(plan, rank)
        self.fixed_x, self.fixed_y = source.read(self.fixed)
        self.augmenter = build_augmenter(cfg.data.augmentation, cfg.train.seed + rank)
        get_logger().debug("worker rank %d: block of %d rows in memory (%.1f MiB), peak RSS %.1f MiB",
                           rank, len(self.fixed), self.fixed_x.nbytes / 2**20, peak_rss_mib())

    def set_blocks(self, block_bounds: list[tuple[int, int]]) -> bool:
        """Rebalancing: adopt re-cut blocks; re-read this worker's rows when its block changed."""
        self.block_sizes = [end - start for start, end in block_bounds]
        start, end = block_bounds[self.rank - 1]
        fixed = np.sort(shuffled_order(self.total, self.shuffle_seed)[start:end])
        if np.array_equal(fixed, self.fixed):
            return False
        self.fixed = fixed
        self.fixed_x, self.fixed_y = self.source.read(fixed)
        return True

    def round_total(self, round_index: int) -> int:
        """Samples all workers train on in ``round_index`` (the weighted average's denominator)."""
        return sum(size + extra_count(self.total, size, round_index, self.increment)
                   for size in self.block_sizes)

    def for_round(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        extra = draw_extra(self.total, self.fixed, round_index, self.rank, self.seed, self.increment)
        x, y = self.fixed_x, self.fixed_y
        if len(extra):
            extra_x, extra_y = self.source.read(extra)
            x, y = np.concatenate([x, extra_x]), np.concatenate([y, extra_y])
            get_logger().debug(share_line(round_index, self.rank, len(self.fixed), len(extra), self.total))
        return augment(x, self.augmenter), y


def _sends_validation(cfg: Config) -> bool:
    return cfg.aggregation.method == "best"  # workers score best-of candidates on it


def scatter_rows(transport: Any, cfg: Config, dataset: Dataset, plan: Any) -> None:
    """Scheduler side of ``scatter``: send each worker every training row it will use.

    Workers under ``scatter`` never open the source, so best-of election's
    validation rows travel too.
    """
    for rank in range(1, transport.size):
        positions = positions_needed(plan.num_train, fixed_positions(plan, rank), cfg.train.epochs, rank,
                                     cfg.train.seed, cfg.data.increment)
        x, y = dataset.train.read(positions)
        arrays = [positions, x, y]
        if _sends_validation(cfg):
            arrays += [dataset.x_val, dataset.y_val]
        transport.send_object((dataset.name, dataset.input_shape, dataset.num_classes), rank, TAG_DATA)
        for array in arrays:
            transport.send_large_array(array, rank)
        get_logger().info("scatter: sent worker rank %d %d training rows%s (%.2f MB)", rank, len(positions),
                          " and the validation split" if _sends_validation(cfg) else "",
                          sum(a.nbytes for a in arrays) / 1e6)


def receive_rows(transport: Any, cfg: Config) -> tuple[HeldRows, Dataset]:
    name, input_shape, num_classes = transport.recv_object(0, TAG_DATA).payload
    positions, x, y = (transport.recv_large_array(0) for _ in range(3))
    if _sends_validation(cfg):
        x_val, y_val = transport.recv_large_array(0), transport.recv_large_array(0)
    else:
        x_val, y_val = np.empty((0, *input_shape), np.float32), np.empty(0, np.int32)
    return HeldRows(positions, x, y), validation_only(name, x_val, y_val, input_shape, num_classes)


def place_data(transport: Any, cfg: Config, dataset: Dataset | None,
               plan: Any) -> tuple[WorkerData | None, Dataset | None]:
    """Give every worker its training rows.

    Returns the worker's :class:`WorkerData` (None on rank 0) and the dataset
    the rank goes on with: under ``scatter`` a worker loaded none at set-up
    and gets a validation-only one here.
    """
    scatter = cfg.data.placement == "scatter"
    if transport.rank == 0:
        if scatter:
            scatter_rows(transport, cfg, dataset, plan)
        return None, dataset
    if scatter:
        held, dataset = receive_rows(transport, cfg)
        return WorkerData(held, plan, transport.rank, cfg), dataset
    return WorkerData(dataset.train, plan, transport.rank, cfg), dataset
