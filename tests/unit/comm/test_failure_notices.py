"""Failure notices and bounded waits on the in-process transport: nobody waits for a rank that left or stopped."""

from __future__ import annotations

import time

import pytest

from mpi_trainer.comm.failures import PeerFailure, notice_text
from mpi_trainer.comm.local import LocalWorld


def test_a_notice_wakes_a_wait_and_says_who_failed_and_why():
    world = LocalWorld(3)
    transports = world.transports()
    transports[2].notify_failure(notice_text(ValueError("x" * 5000)))
    with pytest.raises(PeerFailure, match=r"rank 2 \(worker\) on host local failed: ValueError: x+\.\.\.$") as caught:
        transports[0].recv_object(tag=12, timeout=30)
    assert caught.value.rank == 2 and len(str(caught.value)) < 2100  # the error is cut, the notice stays small
    with pytest.raises(PeerFailure):
        transports[1].check_notices()


def test_the_end_of_a_job_waits_at_most_the_bound_for_a_rank_that_never_gets_there():
    world = LocalWorld(2)
    scheduler, _ = world.transports()
    scheduler.bound, scheduler.phase = 0.2, "teardown"
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"rank 0 of 2 on local, teardown: no barrier within 0.2 s"):
        scheduler.barrier()  # rank 1 never reaches the end of the job
    assert time.perf_counter() - started < 2.0
