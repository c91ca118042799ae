"""Transport byte accounting and non-spinning waits, against a fake communicator."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

from mpi_trainer.comm import Transport


class FakeRequest:
    def __init__(self, ready_after: int = 0) -> None:
        self.tests = 0
        self.ready_after = ready_after

    def Test(self, status=None) -> bool:  # noqa: N802 - MPI's name
        self.tests += 1
        return self.tests > self.ready_after

    def Wait(self, status=None) -> None:  # noqa: N802
        self.tests = self.ready_after + 1


class FakeComm:
    """Records calls; every request completes after ``ready_after`` tests."""

    def __init__(self, rank: int, size: int, ready_after: int = 0) -> None:
        self.rank, self.size, self.ready_after = rank, size, ready_after
        self.requests: list[FakeRequest] = []

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def _request(self, *args, **kwargs) -> FakeRequest:
        request = FakeRequest(self.ready_after)
        self.requests.append(request)
        return request

    Isend = Ibcast = Ireduce = Ibarrier = _request


def test_root_broadcast_counts_one_copy_per_other_rank():
    buf = np.zeros(100, np.float32)
    root = Transport(FakeComm(0, 4))
    root.broadcast(buf)
    assert root.take_bytes() == 400 * 3
    worker = Transport(FakeComm(2, 4))
    worker.broadcast(buf)
    assert worker.take_bytes() == 0


def test_reduction_counts_at_workers_only_and_take_resets():
    buf = np.zeros(10, np.float32)
    worker = Transport(FakeComm(1, 3))
    worker.reduce_sum(buf)
    worker.reduce_sum(buf)
    assert worker.take_bytes() == 80 and worker.take_bytes() == 0
    assert worker.total_bytes_sent == 80
    root = Transport(FakeComm(0, 3))
    root.reduce_sum(buf)
    assert root.take_bytes() == 0


def test_objects_count_their_pickled_size():
    transport = Transport(FakeComm(1, 3))
    payload = {"round": 3, "loss": 0.25}
    sent = transport.send_object(payload, 0, tag=5)
    assert sent == len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)) == transport.take_bytes()


def test_waiting_polls_with_sleeps_instead_of_spinning():
    comm = FakeComm(1, 2, ready_after=40)
    transport = Transport(comm, max_sleep=0.002)
    started = time.perf_counter()
    transport.send_array(np.zeros(4, np.float32), 0)
    elapsed = time.perf_counter() - started
    assert comm.requests[0].tests == 41
    assert elapsed > 0.02  # it slept between tests
    assert transport.wait_cpu_seconds < 0.5 * transport.wait_wall_seconds


def test_blocking_mode_calls_wait_once():
    comm = FakeComm(1, 2, ready_after=1000)
    transport = Transport(comm, max_sleep=0)
    transport.send_array(np.zeros(4, np.float32), 0)
    assert comm.requests[0].tests == 1001  # Wait() completed it without polling


def test_wait_with_timeout_names_what_was_awaited():
    comm = FakeComm(0, 3, ready_after=10**9)
    transport = Transport(comm)
    with pytest.raises(TimeoutError, match="rank 0 of 3 .* no weights reduction within 0.05 s"):
        transport.reduce_sum(np.zeros(2, np.float32), timeout=0.05)
