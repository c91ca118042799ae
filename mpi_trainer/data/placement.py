"""Where a worker's training rows come from: the shared file, or the scheduler over MPI.

``shared``: every worker opens the same file and reads only its block's rows
(h5py slicing, memory-mapped ``.npz``); nothing but the block plan travels.
``scatter``: the scheduler reads the training rows and sends each worker
the rows it will use, in chunks below MPI's 2 GiB message limit, once at
set-up; with random data increment that is the union of its fixed block and
every draw it will make, which the scheduler can predict from the seed.
With rebalancing, a re-cut changes what a worker needs: the scheduler keeps a
:class:`ScatterLedger` of the rows each worker holds and sends, with the next
round's order, only the rows that changed owner; the worker merges them in and
drops the rows it will not use again.

:class:`WorkerData` then serves each round's input: a :class:`HeldBlock` of rows in memory (the
fixed block, plus the round's random draw, passed through real-time augmentation if enabled), or a
:class:`StreamedBlock`, a range of a streamed input that ``model.fit`` reads as it trains.
"""

from __future__ import annotations

import resource
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard, Union

import numpy as np

from mpi_trainer.config import Config
from mpi_trainer.data.augmentation import augment, build_augmenter
from mpi_trainer.data.feed import RowsFeed
from mpi_trainer.data.increment import draw_extra, positions_needed, round_samples, share_line
from mpi_trainer.data.partition import shard, shuffled_order
from mpi_trainer.data.sources import Dataset, RowArray, TrainPart, TrainRows, validation_only
from mpi_trainer.logs import get_logger

if TYPE_CHECKING:
    from mpi_trainer.comm.messages import JobPlan
    from mpi_trainer.comm.protocol import SchedulerLink, WorkerLink
    from mpi_trainer.data.adapters import BlockFeed
    from mpi_trainer.data.streamed import StreamedTrain


@dataclass
class HeldRows:
    """Training rows a worker received from the scheduler, keyed by sorted training position."""

    positions: np.ndarray
    x: np.ndarray
    y: np.ndarray
    streams = False  # rows in memory, like the shared source's

    def read(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        index = np.searchsorted(self.positions, positions)
        index = np.minimum(index, len(self.positions) - 1)
        if not np.array_equal(self.positions[index], positions):
            raise RuntimeError("a worker asked for training rows the scheduler did not send it")
        return self.x[index], self.y[index]

    def merged(self, arrived: HeldRows, keep: np.ndarray) -> HeldRows:
        """These rows and ``arrived`` together, cut down to exactly the sorted positions ``keep``."""
        mine = np.isin(self.positions, keep)
        positions = np.concatenate([self.positions[mine], arrived.positions])
        order = np.argsort(positions, kind="stable")
        pooled = HeldRows(positions[order], np.concatenate([self.x[mine], arrived.x])[order],
                          np.concatenate([self.y[mine], arrived.y])[order])
        return HeldRows(np.asarray(keep), *pooled.read(keep))


@dataclass
class EvalShard:
    """The rows a worker scores under ``evaluation.where = "workers"``: its parts of the test and
    validation splits (part ``rank - 1`` of ``workers``; possibly empty)."""

    x_test: RowArray
    y_test: RowArray
    x_val: RowArray
    y_val: RowArray


def evaluation_arrays(dataset: Dataset, rank: int, workers: int) -> list[np.ndarray]:
    """Worker ``rank``'s part of the test split and of the validation split, as cut from a full dataset."""
    test, val = shard(len(dataset.y_test), rank - 1, workers), shard(len(dataset.y_val), rank - 1, workers)
    return [dataset.x_test[test], dataset.y_test[test], dataset.x_val[val], dataset.y_val[val]]


def _scores_on_workers(cfg: Config) -> bool:
    return cfg.evaluation.on_workers


def block_positions(num_train: int, shuffle_seed: int, bounds: tuple[int, int]) -> np.ndarray:
    """The training positions of block ``[start, end)`` of the seeded shuffle, in increasing order."""
    start, end = bounds
    return np.sort(shuffled_order(num_train, shuffle_seed)[start:end])


def fixed_positions(plan: JobPlan, rank: int) -> np.ndarray:
    """A worker's fixed block: its slice of the seeded shuffle, in increasing order."""
    return block_positions(plan.num_train, plan.shuffle_seed, plan.block_bounds[rank - 1])


def data_rounds(cfg: Config) -> int:
    """How many rounds of data a worker may be asked for: ``train.epochs``, plus ``s`` under SSP.

    Under SSP a worker's data follows its own clock, and a fast worker may run up
    to ``s`` updates ahead of the slowest one, whose clock is at most ``epochs - 1``
    while updates are still handed out.
    """
    return cfg.train.epochs + cfg.aggregation.ssp


def rows_needed(plan: JobPlan, rank: int, cfg: Config, start_round: int) -> np.ndarray:
    """Every training position worker ``rank`` uses under ``plan`` from ``start_round`` to the end of the run."""
    return positions_needed(plan.num_train, fixed_positions(plan, rank), data_rounds(cfg), rank, cfg.train.seed,
                            cfg.data.increment, start_round)


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# Where a worker reads its training rows: the shared source, the rows the scheduler sent it (scatter),
# or a streamed input's block.
RowSource = Union[TrainPart, "HeldRows"]
# A round's training input: the rows in memory, or a streamed block that model.fit reads as it trains.
TrainingInput = Union[np.ndarray, "BlockFeed"]


def is_streamed(source: RowSource) -> TypeGuard[StreamedTrain]:
    """A streamed input, told by its ``streams`` flag (not by its class: the module that defines it imports
    Keras, which a worker loads only after its process is placed on its device)."""
    return source.streams


def worker_data(source: RowSource, plan: JobPlan, rank: int, cfg: Config) -> WorkerData:
    """Worker ``rank``'s share of the training input: a block of rows it holds (:class:`HeldBlock`), or a
    block of a streamed input that its ``model.fit`` reads as it trains (:class:`StreamedBlock`)."""
    if is_streamed(source):
        return StreamedBlock(source, plan, rank, cfg)
    return HeldBlock(source, plan, rank, cfg)


class WorkerData(ABC):
    """One worker's share of the training input, round by round: its fixed block, what each round trains
    on, single batches of the block (k-step rounds, timing), and its block after a re-cut."""

    fixed: np.ndarray  # the block: training positions (held rows) or units of the input (streamed)
    fixed_x: TrainingInput
    fixed_y: np.ndarray | None  # None for a streamed block (its batches hold the labels)

    def __init__(self, plan: JobPlan, rank: int, cfg: Config) -> None:
        self.rank = rank
        self.total = plan.num_train
        self.rounds = data_rounds(cfg)
        self.increment = cfg.data.increment
        self.seed = cfg.train.seed
        self.shuffle_seed = plan.shuffle_seed
        self.block_sizes = [end - start for start, end in plan.block_bounds]
        self.augmenter = build_augmenter(cfg.data.augmentation, cfg.train.seed + rank)
        self.evaluation: EvalShard | None = None  # set by place_data under evaluation.where = "workers"

    @staticmethod
    def units(x: TrainingInput) -> int:
        """The samples (or, for a pipeline, batches) of a block."""
        return len(x) if isinstance(x, np.ndarray) else x.units

    def round_total(self, round_index: int) -> int:
        """Samples all workers train on in ``round_index`` (the weighted average's denominator)."""
        return round_samples(self.total, self.block_sizes, round_index, self.increment)

    @abstractmethod
    def first_rows(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The block's first rows as arrays, for dry runs and timing."""

    @abstractmethod
    def trailing_rows(self, batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The partial batch that ends each pass of k-step rounds over the block (None: none)."""

    @abstractmethod
    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the fixed block (k-step rounds, rebalancing's timing), augmented."""

    @abstractmethod
    def sample_weights(self, y: np.ndarray, block_rows: np.ndarray | None = None) -> np.ndarray | None:
        """The training weights of the labels ``y`` of the block's rows ``block_rows`` (None: the whole block,
        or the round's rows), from ``fit``'s ``sample_weight`` or ``class_weight``; None: unweighted."""

    @abstractmethod
    def for_round(self, round_index: int) -> BlockFeed:
        """What round ``round_index``'s ``model.fit`` reads: the block's feed."""

    @abstractmethod
    def set_blocks(self, block_bounds: list[tuple[int, int]]) -> bool:
        """Rebalancing: adopt re-cut blocks; True when this worker's block changed."""


class HeldBlock(WorkerData):
    """A block of rows held in memory: the worker's slice of the seeded shuffle, read from the shared
    source or from the rows the scheduler sent it (scatter), plus each round's random draw (data
    increment), passed through real-time augmentation if enabled."""

    fixed_x: np.ndarray
    fixed_y: np.ndarray

    def __init__(self, source: RowSource, plan: JobPlan, rank: int, cfg: Config) -> None:
        super().__init__(plan, rank, cfg)
        self.source = source
        self.shuffle = cfg.train.shuffle  # fit's shuffle: a new random order of the rows every round
        self.class_weight = plan.class_weight
        self.fixed = fixed_positions(plan, rank)
        self.fixed_x, self.fixed_y = source.read(self.fixed)
        get_logger().debug("worker rank %d: block of %d rows in memory (%.1f MiB), peak RSS %.1f MiB",
                           rank, len(self.fixed), self.fixed_x.nbytes / 2**20, peak_rss_mib())

    def first_rows(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        return self.fixed_x[:count], self.fixed_y[:count]

    def trailing_rows(self, batch_size: int) -> tuple[np.ndarray, np.ndarray] | None:
        partial = len(self.fixed_x) % batch_size
        return (self.fixed_x[:partial], self.fixed_y[:partial]) if partial else None

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Augmented batch by batch rather than the block per round."""
        return augment(self.fixed_x[rows], self.augmenter), self.fixed_y[rows]

    def sample_weights(self, y: np.ndarray, block_rows: np.ndarray | None = None) -> np.ndarray | None:
        """``class_weight`` as Keras turns it into sample weights for arrays (a class without a weight weighs
        1), or ``sample_weight``'s rows: a weight per source row (scatter, data increment and rebalancing
        refuse it, so the rows are the fixed block's). ``fit`` refuses both together, as Keras does."""
        if self.class_weight is not None:
            from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

            weights: np.ndarray = class_weight_to_sample_weights(y, self.class_weight)
            return weights
        source = self.source
        if not isinstance(source, TrainRows) or source.weights is None:
            return None
        given: np.ndarray = source.weights[source.rows[self.fixed]]
        return given if block_rows is None else given[block_rows]

    def for_round(self, round_index: int) -> RowsFeed:
        """The fixed block plus the round's draw (data increment), augmented, with its rows' sample weights."""
        extra = draw_extra(self.total, self.fixed, round_index, self.rank, self.seed, self.increment)
        x, y = self.fixed_x, self.fixed_y
        if len(extra):
            extra_x, extra_y = self.source.read(extra)
            x, y = np.concatenate([x, extra_x]), np.concatenate([y, extra_y])
            get_logger().debug(share_line(round_index, self.rank, len(self.fixed), len(extra), self.total))
        return RowsFeed(augment(x, self.augmenter), y, self.sample_weights(y), self.shuffle, self.seed + self.rank)

    def set_blocks(self, block_bounds: list[tuple[int, int]]) -> bool:
        """Re-read this worker's rows when its block changed."""
        self.block_sizes = [end - start for start, end in block_bounds]
        fixed = block_positions(self.total, self.shuffle_seed, block_bounds[self.rank - 1])
        if np.array_equal(fixed, self.fixed):
            return False
        self.fixed = fixed
        self.fixed_x, self.fixed_y = self.source.read(fixed)
        return True

    def take_rows(self, arrived: HeldRows, block_bounds: list[tuple[int, int]], round_index: int) -> None:
        """Scatter after a re-cut: hold the rows that came, and drop those not used from ``round_index`` on.

        Call before :meth:`set_blocks`, which then reads the new block from the merged rows.
        """
        fixed = block_positions(self.total, self.shuffle_seed, block_bounds[self.rank - 1])
        keep = positions_needed(self.total, fixed, self.rounds, self.rank, self.seed, self.increment, round_index)
        if not isinstance(self.source, HeldRows):
            raise TypeError("only a worker that holds rows the scheduler sent it (data.placement = 'scatter') "
                            "takes rows after a re-cut")
        self.source = held = self.source.merged(arrived, keep)
        get_logger().debug("round %d: received %d training rows, now holding %d (%.1f MiB)", round_index,
                           len(arrived.positions), len(keep), held.x.nbytes / 2**20)


class StreamedBlock(WorkerData):
    """A contiguous range of a streamed input's units (data.stream, or a pipeline handed to ``fit``), read
    as ``model.fit`` trains on it. Data increment, scatter and k-step rounds refuse streamed inputs."""

    fixed_x: BlockFeed
    fixed_y: None

    def __init__(self, source: StreamedTrain, plan: JobPlan, rank: int, cfg: Config) -> None:
        super().__init__(plan, rank, cfg)
        self.streamed = source
        self.class_weight = plan.class_weight
        self.bounds = plan.block_bounds[rank - 1]
        self.fixed = np.arange(*self.bounds)
        self.fixed_x, self.fixed_y = self.open_block(), None
        get_logger().debug("worker rank %d: block [%d, %d) of %s streamed, peak RSS %.1f MiB", rank,
                           *self.bounds, source.adapter.unit, peak_rss_mib())

    def open_block(self) -> BlockFeed:
        feed = self.streamed.block(self.bounds, self.rank, len(self.block_sizes))
        feed.augmenter, feed.class_weight = self.augmenter, self.class_weight
        return feed

    def first_rows(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The input's first batch."""
        return self.streamed.read(np.arange(count))

    def trailing_rows(self, batch_size: int) -> None:
        return None

    def batch(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Its first batch's rows: rebalancing's timing (k-step rounds refuse a streamed input)."""
        x, y = self.first_rows(len(rows))
        return augment(x, self.augmenter), y

    def sample_weights(self, y: np.ndarray, block_rows: np.ndarray | None = None) -> None:
        """None: a streamed input's batches carry their own weights (Keras applies ``class_weight`` to them)."""
        return None

    def for_round(self, round_index: int) -> BlockFeed:
        return self.fixed_x

    def set_blocks(self, block_bounds: list[tuple[int, int]]) -> bool:
        """Open the re-cut range when this worker's block changed."""
        self.block_sizes = [end - start for start, end in block_bounds]
        if tuple(block_bounds[self.rank - 1]) == tuple(self.bounds):
            return False
        start, end = block_bounds[self.rank - 1]
        self.bounds = (start, end)
        self.fixed, self.fixed_x = np.arange(*self.bounds), self.open_block()
        return True


def _sends_validation(cfg: Config) -> bool:
    return cfg.aggregation.elects  # workers score best-of candidates on it


def scatter_rows(link: SchedulerLink, cfg: Config, dataset: Dataset, plan: JobPlan) -> None:
    """Scheduler side of ``scatter``: send each worker every training row it will use.

    Workers under ``scatter`` never open the source, so best-of election's
    validation rows travel too. ``link`` is the scheduler's end of the protocol.
    """
    for rank in link.workers:
        positions = rows_needed(plan, rank, cfg, plan.start_round)
        x, y = dataset.train.read(positions)
        arrays = [positions, x, y]
        if _sends_validation(cfg):
            arrays += [np.asarray(dataset.x_val), np.asarray(dataset.y_val)]  # arrays: scatter streams nothing
        if _scores_on_workers(cfg):
            arrays += evaluation_arrays(dataset, rank, len(link.workers))
        meta = (dataset.name, dataset.input_shape, dataset.num_outputs, dataset.classes, dataset.y_test[:0])
        link.send_split(rank, meta, arrays)
        get_logger().info("scatter: sent worker rank %d %d training rows%s (%.2f MB)", rank, len(positions),
                          (" and the validation split" if _sends_validation(cfg) else "")
                          + (" and its evaluation shard" if _scores_on_workers(cfg) else ""),
                          sum(a.nbytes for a in arrays) / 1e6)


def receive_rows(link: WorkerLink, cfg: Config) -> tuple[HeldRows, Dataset, EvalShard | None]:
    """A worker's side of ``scatter``: its rows, a validation-only dataset, and its evaluation shard."""
    count = 3 + 2 * _sends_validation(cfg) + 4 * _scores_on_workers(cfg)
    (name, input_shape, num_outputs, classes, no_labels), arrays = link.recv_split(count)
    positions, x, y = arrays[:3]
    if _sends_validation(cfg):
        x_val, y_val = arrays[3:5]
    else:
        x_val, y_val = np.empty((0, *input_shape), np.float32), no_labels
    evaluation = EvalShard(*arrays[-4:]) if _scores_on_workers(cfg) else None
    dataset = validation_only(name, x_val, y_val, input_shape, num_outputs, classes)
    return HeldRows(positions, x, y), dataset, evaluation


class ScatterLedger:
    """Scheduler side of scatter with rebalancing: the training positions each worker holds.

    It starts from what :func:`scatter_rows` sent. After a re-cut, a worker needs
    its new block and the draws made from it, from the next round to the end of
    the run; it is sent only what it lacks and drops the rest, so afterwards it
    holds exactly what it needs and the ledger says so.
    """

    def __init__(self, cfg: Config, plan: JobPlan, workers: list[int]) -> None:
        self.cfg = cfg
        self.held = {rank: rows_needed(plan, rank, cfg, plan.start_round) for rank in workers}
        self.unconfirmed: dict[int, np.ndarray] | None = None  # what was held before rows not yet taken

    def recut(self, plan: JobPlan, start_round: int) -> dict[int, np.ndarray]:
        """The positions each worker must receive to train on ``plan``'s blocks from ``start_round`` on."""
        if self.unconfirmed is None:
            self.unconfirmed = dict(self.held)
        return {rank: self.hand_over(plan, rank, start_round) for rank in list(self.held)}

    def confirm(self) -> None:
        """Every worker took the rows of the last re-cut (its round started)."""
        self.unconfirmed = None

    def doubt(self) -> None:
        """A round failed before its re-cut's rows were confirmed (fault.survive): a worker holds the rows
        from before the re-cut or from after it, so only those in both are counted as held; the next
        re-cut then sends whatever may be missing (a row sent twice is kept once)."""
        if self.unconfirmed is not None:
            self.held = {rank: np.intersect1d(rows, self.unconfirmed.get(rank, rows), assume_unique=True)
                         for rank, rows in self.held.items()}
            self.unconfirmed = None

    def hand_over(self, plan: JobPlan, rank: int, start_round: int) -> np.ndarray:
        """The positions worker ``rank`` must receive to train on ``plan``'s blocks from ``start_round`` on.

        Under SSP each worker takes a re-cut with its own next update, at its own clock.
        """
        needed = rows_needed(plan, rank, self.cfg, start_round)
        moved = np.setdiff1d(needed, self.held[rank], assume_unique=True)
        self.held[rank] = needed
        return moved


def moved_rows(dataset: Dataset, positions: np.ndarray) -> HeldRows:
    """The training rows at ``positions``, to send to the worker that now owns them."""
    return HeldRows(positions, *dataset.train.read(positions))


def place_data(link: SchedulerLink | WorkerLink, rank: int, cfg: Config, dataset: Dataset | None,
               plan: JobPlan) -> tuple[WorkerData | None, Dataset | None]:
    """Give every worker its training rows.

    ``link`` is this rank's end of the protocol: the scheduler's on rank 0, a worker's elsewhere.
    Returns the worker's :class:`WorkerData` (None on rank 0) and the dataset the rank goes on with:
    under ``scatter`` a worker loaded none at set-up and gets a validation-only
    one here.
    """
    from mpi_trainer.comm.protocol import WorkerLink  # loaded already, with the transport under ``link``

    scatter = cfg.data.scatters
    if not isinstance(link, WorkerLink):
        if scatter:
            scatter_rows(link, cfg, _loaded(dataset, rank), plan)
        return None, dataset
    data: WorkerData
    if scatter:
        held, dataset, evaluation = receive_rows(link, cfg)
        data = HeldBlock(held, plan, rank, cfg)
    else:
        dataset = _loaded(dataset, rank)
        data = worker_data(dataset.train, plan, rank, cfg)
        evaluation = own_shard(dataset, rank, link.workers) if _scores_on_workers(cfg) else None
    data.evaluation = evaluation
    return data, dataset


def _loaded(dataset: Dataset | None, rank: int) -> Dataset:
    """The dataset read at set-up, which every rank but a worker under ``scatter`` has."""
    if dataset is None:
        raise RuntimeError(f"rank {rank} read no dataset at set-up, and only a worker under scatter reads none")
    return dataset


def own_shard(dataset: Dataset, rank: int, workers: int) -> EvalShard:
    """Shared placement: the worker's parts of the splits it read.

    A job's worker read only its part of the test split (``load_dataset_for_rank``)
    and the validation split whole (best-of scores candidates on it).
    """
    if dataset.test_part is None:
        return EvalShard(*evaluation_arrays(dataset, rank, workers))
    if dataset.test_part != (rank - 1, workers):
        raise ValueError(f"worker rank {rank} holds part {dataset.test_part} of the test split, "
                         f"expected part {(rank - 1, workers)}")
    val = shard(len(dataset.y_val), rank - 1, workers)
    return EvalShard(dataset.x_test, dataset.y_test, dataset.x_val[val], dataset.y_val[val])
