"""Failure notices and bounded waits on the in-process transport: nobody waits for a rank that left or stopped."""

from __future__ import annotations

import time

import keras
import pytest
from local_job import build_local_job

from mpi_trainer.comm.failures import PeerFailure, notice_text
from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.comm.protocol import RoundOrder, SchedulerLink, WorkerLink
from mpi_trainer.launch.fail_together import fail_together


class BreaksAt(keras.callbacks.Callback):
    """A user's callback that raises on the scheduler after round ``at``."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.at:
            raise RuntimeError("the sweep's callback broke")


def test_a_failure_on_rank_0_ends_fit_on_every_worker_with_an_error_naming_it(tmp_path):
    engine, team, world = build_local_job(tmp_path, workers=2, callbacks=[BreaksAt(1)], train={"epochs": 5})
    transports = world.transports()

    def caught(rank, run):  # as a sweep loop calls fit: inside try/except
        def play():
            try:
                with fail_together(transports[rank]):
                    run()
            except Exception as exc:  # noqa: BLE001 - the test looks at what each rank got
                return exc
            return None
        return play

    started = time.perf_counter()
    results = world.run({0: caught(0, engine.run), **{w.rank: caught(w.rank, w.run) for w in team}}, timeout=120)
    assert isinstance(results[0], RuntimeError) and str(results[0]) == "the sweep's callback broke"
    for rank in (1, 2):
        assert isinstance(results[rank], PeerFailure), results[rank]
        assert str(results[rank]) == ("rank 0 (the scheduler) on host local failed: RuntimeError: "
                                      "the sweep's callback broke")
    assert time.perf_counter() - started < 60
    assert len(engine.rounds) == 2  # rounds 0 and 1 were recorded before the callback broke


def test_a_worker_waits_for_its_next_order_at_most_twice_the_schedulers_bound():
    world = LocalWorld(2)
    scheduler, worker = world.transports()
    scheduler.bound = 0.2
    SchedulerLink(scheduler).send_order(1, RoundOrder(3))
    link = WorkerLink(worker)
    assert link.recv_order().round == 3 and worker.bound == pytest.approx(0.4)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"rank 1 of 2 on local, waiting for the scheduler's next order "
                                           r"\(after round 3\): no message \(tag 11\) within 0.4 s"):
        link.recv_order()  # the scheduler never sends another
    assert 0.4 <= time.perf_counter() - started < 2.0


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
