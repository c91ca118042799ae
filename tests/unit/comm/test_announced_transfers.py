"""Announced (large) point-to-point transfers over real MPI, in one process.

A rank sends to itself on a private duplicate of ``COMM_SELF``: the sender runs in a thread
(mpi4py asks for MPI_THREAD_MULTIPLE), so the announce / clear handshake really happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from mpi_trainer.comm.transport import Transport


@pytest.fixture
def comm() -> Iterator[object]:
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("this MPI does not provide MPI_THREAD_MULTIPLE")
    duplicate = MPI.COMM_SELF.Dup()  # a late message cannot leak into another test
    yield duplicate
    duplicate.Free()


class Sender(threading.Thread):
    """Runs ``send(transport)`` on its own Transport after ``delay`` seconds; keeps its error."""

    def __init__(self, comm, send: Callable[[Transport], None], delay: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.transport, self.send, self.delay = Transport(comm), send, delay
        self.error: BaseException | None = None

    def run(self) -> None:
        time.sleep(self.delay)
        try:
            self.send(self.transport)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc

    def finish(self) -> Transport:
        self.join(timeout=30)
        assert not self.is_alive(), "sender still blocked"
        if self.error is not None:
            raise self.error
        return self.transport


def test_weights_arrive_exactly_and_are_counted_once(comm):
    weights = np.random.default_rng(0).standard_normal(500_000).astype(np.float32)  # 2 MB: announced
    sender = Sender(comm, lambda t: t.send_array(weights, 0))
    sender.start()
    received = Transport(comm).recv_array(np.empty_like(weights), source=-1)
    assert sender.finish().take_bytes() == weights.nbytes
    assert received.source == 0 and received.nbytes == weights.nbytes
    np.testing.assert_array_equal(received.payload, weights)


def test_a_large_object_arrives_whole(comm):
    state = {"moments": np.arange(100_000, dtype=np.float32), "step": 7}
    sender = Sender(comm, lambda t: t.send_object(state, 0, tag=15))
    sender.start()
    received = Transport(comm).recv_object(0, tag=15).payload
    sender.finish()
    assert received["step"] == 7
    np.testing.assert_array_equal(received["moments"], state["moments"])


def test_a_large_data_array_arrives_whole_in_chunks(comm):
    rows = np.arange(3 * 200_000, dtype=np.int64).reshape(3, 200_000)

    def send(transport: Transport) -> None:
        transport.max_message_bytes = 1 << 20  # 4.8 MB in five chunks
        transport.send_large_array(rows, 0)

    sender = Sender(comm, send)
    sender.start()
    received = Transport(comm).recv_large_array(0)
    sender.finish()
    assert received.dtype == rows.dtype
    np.testing.assert_array_equal(received, rows)


def test_an_array_sent_in_parts_is_taken_message_by_message_without_the_whole(comm):
    state = np.arange(1_000_000, dtype=np.float32)  # 4 MB in three parts, in 1 MB messages

    def send(transport: Transport) -> None:
        transport.max_message_bytes = (1 << 20) + 2  # not a whole number of floats: messages keep whole ones
        transport.send_array_parts((part for part in np.array_split(state, 3)), state.shape, np.float32, 0)

    sender = Sender(comm, send)
    sender.start()
    receiver, parts = Transport(comm), []
    incoming = receiver.recv_large_array_header(0)
    receiver.recv_large_array_body(incoming, lambda part: parts.append(part.copy()))
    sender.finish()
    assert incoming.shape == state.shape and max(part.nbytes for part in parts) <= (1 << 20)
    np.testing.assert_array_equal(np.concatenate(parts), state)


def test_parts_that_do_not_fill_the_announced_shape_are_refused_with_the_sizes(comm):
    transport = Transport(comm)
    with pytest.raises(ValueError, match=r"the parts of an array of shape \(100,\) \(400 bytes\) held 200 bytes"):
        transport.send_array_parts([np.ones(50, np.float32)], (100,), np.float32, 0, tag=6, timeout=5)
    incoming = transport.recv_large_array_header(0, tag=6)  # take what went out: the header, then 50 floats
    comm.Recv(np.empty(50, np.float32), 0, 6)
    assert incoming.shape == (100,)


def test_a_large_array_whose_chunks_never_come_times_out_within_the_bound(comm):
    sender = Sender(comm, lambda t: t.send_object(((1000,), "<f4", False), 0, tag=5))  # the header alone
    sender.start()
    receiver = Transport(comm)
    receiver.bound = 0.3
    started = time.perf_counter()
    with pytest.raises(TimeoutError):
        receiver.recv_large_array(0, tag=5)
    assert time.perf_counter() - started < 5
    sender.finish()


def test_a_sender_waiting_for_a_late_receiver_sleeps(comm):
    weights = np.ones(500_000, np.float32)
    sender = Sender(comm, lambda t: t.send_array(weights, 0))
    sender.start()
    time.sleep(0.5)  # the receiver comes late
    Transport(comm).recv_array(np.empty_like(weights), source=0)
    transport = sender.finish()
    assert transport.wait_wall_seconds >= 0.4
    # Both threads share the process clock: the receiver's own work is small.
    assert transport.wait_cpu_seconds < 0.15 * transport.wait_wall_seconds


def test_a_wrong_size_is_refused_with_the_sizes(comm):
    weights = np.ones(500_000, np.float32)
    sender = Sender(comm, lambda t: t.send_array(weights, 0, tag=13))
    sender.start()
    receiver = Transport(comm)
    with pytest.raises(RuntimeError, match="expected 1000000 bytes of weights from rank 0, received 2000000"):
        receiver.recv_array(np.empty(250_000, np.float32), source=0, tag=13)
    comm.Recv(np.empty_like(weights), 0, 13)  # take the payload so that the sender returns
    sender.finish()


def test_a_send_times_out_when_the_receiver_never_comes(comm):
    transport = Transport(comm)
    started = time.perf_counter()
    with pytest.raises(TimeoutError, match="no receiver for the weights within 0.2 s \\(waiting for rank 0\\)"):
        transport.send_array(np.ones(500_000, np.float32), 0, timeout=0.2)
    assert time.perf_counter() - started < 5
    assert transport.take_bytes() == 0  # nothing moved


def test_collectives_on_one_rank_sum_in_place_fill_the_root_row_and_count_no_traffic(comm):
    """A job whose scheduler is alone (every worker gone) still sums, gathers and broadcasts correctly,
    and the root's own contribution is never counted as traffic."""
    transport = Transport(comm)
    buf = np.arange(10, dtype=np.float32)
    transport.reduce_sum(buf, timeout=1.0)  # in place at the root: its own buffer is the sum
    np.testing.assert_array_equal(buf, np.arange(10, dtype=np.float32))
    out = np.full((1, 10), -1.0, np.float32)
    transport.gather(buf * 2, out, timeout=1.0)
    np.testing.assert_array_equal(out[0], np.arange(10, dtype=np.float32) * 2)
    transport.broadcast(buf, timeout=1.0)
    assert transport.take_bytes() == 0  # nothing left the root: no peer to send to
