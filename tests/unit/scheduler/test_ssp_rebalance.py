"""Block rebalancing under the SSP engine: real workers in one process, one of them slowed down."""

from __future__ import annotations

import csv
import logging
import re

import numpy as np
import pytest
from local_job import run_local_job

from mpi_trainer.data.increment import extra_count, round_samples
from mpi_trainer.data.placement import block_positions

SLOW_RANK_2 = {"batch_delay": 0.004, "slow_ranks": [2], "slow_factor": 4.0}
INCREMENT = {"enabled": True, "load_factor": 0.05, "absolute_factor": 0.8}


def covers_once(bounds: list[tuple[int, int]], total: int) -> bool:
    return bounds[0][0] == 0 and bounds[-1][1] == total and all(
        a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:] + [(total, total + 1)]))


def run_logged(tmp_path, caplog, **sections):
    logger = logging.getLogger("mpi_trainer")
    logger.addHandler(caplog.handler)  # the job's own logger may not propagate to the root
    caplog.set_level(logging.INFO, logger="mpi_trainer")
    try:
        return run_local_job(tmp_path, workers=2, **sections)
    finally:
        logger.removeHandler(caplog.handler)


def cuts_from_log(text: str, total: int) -> list[list[int]]:
    """The equal first cut and every cut the engine logged (calibrated, then re-cut), as block sizes."""
    found = re.findall(r"blocks (?:re-cut by throughput|cut by calibrated speed) \([^)]*\): rank 1: (\d+), "
                       r"rank 2: (\d+)", text)
    return [[total // 2, total - total // 2], *([int(a), int(b)] for a, b in found)]


def trained_cuts(cuts: list[list[int]], worker: int, samples: int, clock: int, increment) -> list[list[int]]:
    """The cuts whose block for ``worker``, plus that clock's draw, make the update's ``samples`` (two cuts
    can give this worker the same block and differ in the others')."""
    total = sum(cuts[0])
    own = worker - 1
    matches = [cut for cut in cuts if cut[own] + extra_count(total, cut[own], clock, increment) == samples]
    assert matches, (worker, samples, clock, cuts)
    return matches


def trained_cut(cuts: list[list[int]], worker: int, samples: int, clock: int, increment) -> list[int]:
    """The latest cut that makes the update's ``samples``."""
    return trained_cuts(cuts, worker, samples, clock, increment)[-1]


def test_ssp_rebalancing_under_scatter_recuts_towards_the_fast_worker_and_moves_its_rows(tmp_path, caplog):
    job = run_logged(tmp_path, caplog, data={"placement": "scatter", "rebalance": True, "increment": INCREMENT},
                     debug=SLOW_RANK_2, aggregation={"method": "weighted", "ssp": 2},
                     train={"epochs": 3, "batch_size": 32})
    engine, total = job.engine, job.engine.plan.num_train
    increment = engine.cfg.data.increment
    assert covers_once(engine.plan.block_bounds, total)  # the plan covers every training row exactly once
    sizes = [end - start for start, end in engine.plan.block_bounds]
    assert sizes[1] < 0.4 * total < sizes[0], sizes  # the slowed rank 2 ends with the smaller block
    # Steps timed before the first update cut its blocks already: the slowed worker's first block is smaller.
    cuts = cuts_from_log(caplog.text, total)
    assert "before round 0 blocks cut by calibrated speed" in caplog.text
    first, second = (report for report, _ in job.workers[1].trained[:2])
    assert trained_cut(cuts, 2, first.samples, first.round, increment)[1] < total // 2, cuts
    assert trained_cut(cuts, 2, second.samples, second.round, increment)[1] < total // 2, cuts
    for worker in job.workers:
        told = engine.told[worker.rank][worker.rank - 1]  # the block its last update was handed
        np.testing.assert_array_equal(worker.data.fixed, block_positions(total, engine.plan.shuffle_seed, told))
        last, _ = worker.trained[-1]  # its block and that clock's draw, from the rows it was sent
        assert last.samples == told[1] - told[0] + extra_count(total, told[1] - told[0], last.round, increment)
        np.testing.assert_array_equal(worker.data.source.positions, engine.ledger.held[worker.rank])
    moved = re.findall(r"sent worker rank (\d+) (\d+) training rows that changed owner", caplog.text)
    assert ("1" in {rank for rank, _ in moved}), moved  # the fast worker received the rows it took over
    with (tmp_path / "updates.csv").open(newline="") as handle:
        for update in csv.DictReader(handle):  # weighted: n_w / N over the cut the update was trained on
            worker, samples, clock = int(update["worker"]), int(update["samples"]), int(update["clock"])
            shares = [samples / round_samples(total, cut, clock, increment)
                      for cut in trained_cuts(cuts, worker, samples, clock, increment)]
            assert any(float(update["share"]) == pytest.approx(share) for share in shares), (update, shares)
