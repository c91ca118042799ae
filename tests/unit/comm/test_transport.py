"""Transport accounting, readiness and non-spinning waits, against a fake communicator.

The fake delivers readiness messages (empty, on their own tags) from the peers listed as
``arrive`` and records the bulk calls, so multi-rank bookkeeping is checked in one process.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest

from mpi_trainer.comm.failures import TAG_FAILED, PeerFailure
from mpi_trainer.comm.handshakes import TAG_ARRIVED, TAG_GOING, TAG_PROCEED
from mpi_trainer.comm.transport import Transport
from mpi_trainer.comm.waits import TransportTimeout, due_sleep, poll_sleep


class FakeRequest:
    def __init__(self, ready_at: float = 0.0) -> None:
        self.ready_at = ready_at
        self.tests = 0
        self.cancelled = False

    def Test(self, status=None) -> bool:  # noqa: N802 - MPI's name
        self.tests += 1
        return time.perf_counter() >= self.ready_at

    def Wait(self, status=None) -> None:  # noqa: N802
        assert self.ready_at != float("inf"), "blocked forever"
        self.ready_at = 0.0

    def Cancel(self) -> None:  # noqa: N802
        self.cancelled = True
        self.ready_at = 0.0


class FakeComm:
    """Rank ``rank`` of ``size``: the ranks in ``arrive`` reach every collective; sends complete at once.

    Those in ``arrive`` and in ``confirm`` (by default all that arrive) also confirm "going".
    ``answer_after`` seconds after it is posted, a receive of a readiness message completes
    (``None``: never, like a peer that does not come).
    """

    def __init__(self, rank: int, size: int, arrive: tuple[int, ...] = (), answer_after: float | None = 0.0,
                 confirm: tuple[int, ...] | None = None):
        self.rank, self.size = rank, size
        confirm = arrive if confirm is None else confirm
        self.pending = [(source, TAG_ARRIVED) for source in arrive] + [(source, TAG_GOING) for source in confirm]
        self.answer_after = answer_after
        self.calls: list[str] = []
        self.receives: list[FakeRequest] = []
        self.bulk_seconds = 0.0  # how long Bcast and Reduce take
        self.aborted: int | None = None

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Isend(self, buf, dest, tag) -> FakeRequest:  # noqa: N802
        self.calls.append(f"Isend tag {tag} to {dest}")
        return FakeRequest()

    def Irecv(self, buf, source, tag) -> FakeRequest:  # noqa: N802
        self.calls.append(f"Irecv tag {tag} from {source}")
        ready_at = float("inf") if self.answer_after is None else time.perf_counter() + self.answer_after
        self.receives.append(FakeRequest(ready_at))
        return self.receives[-1]

    def Iprobe(self, source, tag, status) -> bool:  # noqa: N802
        for sender, sent_tag in self.pending:
            if sent_tag == tag and source in (sender, -1):
                status.Set_source(sender)
                status.Set_elements(_byte(), 0)
                return True
        return False

    def Recv(self, buf, source, tag, status=None) -> None:  # noqa: N802
        self.pending.remove((source, tag))

    def Bcast(self, buf, root) -> None:  # noqa: N802
        self.calls.append("Bcast")
        time.sleep(self.bulk_seconds)

    def Reduce(self, sendbuf, recvbuf, op, root) -> None:  # noqa: N802
        self.calls.append("Reduce")
        time.sleep(self.bulk_seconds)

    def Abort(self, code) -> None:  # noqa: N802
        self.aborted = code


def _byte():
    from mpi4py import MPI

    return MPI.BYTE


def test_root_broadcast_counts_one_copy_per_other_rank():
    buf = np.zeros(100, np.float32)
    root = Transport(FakeComm(0, 4, arrive=(1, 2, 3)))
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
    root = Transport(FakeComm(0, 3, arrive=(1, 2)))
    root.reduce_sum(buf)
    assert root.take_bytes() == 0


def test_root_proceeds_only_once_every_rank_arrived_then_runs_the_blocking_collective():
    comm = FakeComm(0, 3, arrive=(2, 1))
    Transport(comm).reduce_sum(np.zeros(4, np.float32))
    assert comm.calls == [f"Isend tag {TAG_PROCEED} to 1", f"Isend tag {TAG_PROCEED} to 2", "Reduce"]
    assert comm.pending == []  # both arrivals taken off the wire


def test_a_worker_announces_its_arrival_and_waits_for_the_root():
    comm = FakeComm(2, 3)
    Transport(comm).broadcast(np.zeros(4, np.float32))
    assert comm.calls == [f"Isend tag {TAG_ARRIVED} to 0", f"Irecv tag {TAG_PROCEED} from 0",
                          f"Isend tag {TAG_GOING} to 0", "Bcast"]


def test_root_timeout_names_the_ranks_that_never_arrived_and_moves_nothing():
    comm = FakeComm(0, 4, arrive=(2,))
    transport = Transport(comm)
    with pytest.raises(TransportTimeout, match=r"rank 0 of 4 .* no weights reduction within 0.05 s "
                                               r"\(waiting for ranks 1, 3\)") as caught:
        transport.reduce_sum(np.zeros(2, np.float32), timeout=0.05)
    assert caught.value.missing == [1, 3]
    assert "Reduce" not in comm.calls


def test_root_names_a_rank_that_arrived_but_stopped_before_confirming():
    comm = FakeComm(0, 3, arrive=(1, 2), confirm=(1,))
    with pytest.raises(TransportTimeout, match=r"\(waiting for rank 2\)"):
        Transport(comm).broadcast(np.zeros(2, np.float32), timeout=0.05)
    assert "Bcast" not in comm.calls  # the root does not enter a collective that would hang


def test_worker_timeout_cancels_its_pending_receive():
    comm = FakeComm(1, 3, answer_after=None)
    with pytest.raises(TimeoutError, match="no weights broadcast within 0.05 s \\(waiting for rank 0\\)"):
        Transport(comm).broadcast(np.zeros(2, np.float32), timeout=0.05)
    assert comm.receives[-1].cancelled  # a late "proceed" cannot complete it behind our back
    assert "Bcast" not in comm.calls


def test_objects_count_their_pickled_size():
    transport = Transport(FakeComm(1, 3))
    payload = {"round": 3, "loss": 0.25}
    sent = transport.send_object(payload, 0, tag=5)
    assert sent == len(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)) == transport.take_bytes()


def test_waiting_sleeps_instead_of_spinning():
    comm = FakeComm(1, 2, answer_after=0.3)
    transport = Transport(comm, max_sleep=0.005)
    transport.broadcast(np.zeros(4, np.float32))
    assert transport.wait_wall_seconds >= 0.3
    assert comm.receives[0].tests < 2000  # a spinning wait tests about a million times in 0.3 s
    assert transport.wait_cpu_seconds < 0.3 * transport.wait_wall_seconds


def test_blocking_mode_skips_the_readiness_messages():
    comm = FakeComm(1, 2, answer_after=None)
    transport = Transport(comm, max_sleep=0)
    transport.reduce_sum(np.zeros(4, np.float32))
    assert comm.calls == ["Reduce"]


@pytest.mark.parametrize("waited, expected", [(0.0, 0.0), (1e-4, 0.0), (5e-4, 5e-5), (0.01, 0.001),
                                              (0.03, 0.003), (60.0, 0.005)])
def test_a_peer_is_noticed_at_most_a_tenth_of_the_wait_late(waited, expected):
    assert poll_sleep(waited, 0.005) == pytest.approx(expected)


def test_poll_sleep_never_drops_below_the_first_sleep():
    assert poll_sleep(10.0, 0.0) == pytest.approx(2e-5)


def test_a_collective_held_up_after_everyone_entered_ends_the_job(capfd):
    comm = FakeComm(0, 3, arrive=(1, 2))
    comm.bulk_seconds = 0.5  # a peer stopped inside the blocking Reduce
    Transport(comm).reduce_sum(np.zeros(2, np.float32), timeout=0.1)
    assert comm.aborted == 3  # the watchdog's exit status
    assert "the weights reduction did not complete within 0.1 s of every rank entering it" in capfd.readouterr().err


def test_a_prompt_collective_leaves_the_job_alone():
    comm = FakeComm(0, 3, arrive=(1, 2))
    Transport(comm).broadcast(np.zeros(2, np.float32), timeout=0.1)
    time.sleep(0.2)
    assert comm.aborted is None


# -- a message whose arrival time is known (a report at k steps per round) --------------------
@pytest.mark.parametrize("now, expected", [
    (0.050, 0.005),   # long before: the back-off's own sleep
    (0.097, 0.001),   # no sleep runs past the window's opening (due 0.1 - 2 ms)
    (0.099, 5e-5),    # inside the window: fine polling
    (0.109, 5e-5),    # still inside (due + 10 ms)
    (0.200, 0.005),   # the message is late: back to the back-off
])
def test_a_wait_polls_finely_only_around_the_time_its_message_is_due(now, expected):
    assert due_sleep(0.005, now, started=0.0, due=0.1) == pytest.approx(expected)


def test_the_fine_window_is_a_fraction_of_a_short_wait():
    # a wait of 10 ms: the window opens 0.5 ms before the message is due and closes 2.5 ms after
    assert due_sleep(0.001, 0.0094, started=0.0, due=0.01) == pytest.approx(1e-4)
    assert due_sleep(0.001, 0.0124, started=0.0, due=0.01) == pytest.approx(5e-5)
    assert due_sleep(0.001, 0.0126, started=0.0, due=0.01) == pytest.approx(0.001)


class LateMessageComm(FakeComm):
    """One pickled object from rank 1 that becomes visible ``after`` seconds from now."""

    def __init__(self, after: float) -> None:
        super().__init__(0, 2)
        self.data = pickle.dumps("report", protocol=pickle.HIGHEST_PROTOCOL)
        self.visible_at = time.perf_counter() + after
        self.probes = 0

    def Iprobe(self, source, tag, status) -> bool:  # noqa: N802
        self.probes += 1
        if tag == TAG_FAILED or time.perf_counter() < self.visible_at:  # no rank sends a failure notice
            return False
        status.Set_source(1)
        status.Set_elements(_byte(), len(self.data))
        return True

    def Recv(self, buf, source, tag, status=None) -> None:  # noqa: N802
        buf[0][:] = self.data


def test_a_message_that_comes_when_due_is_noticed_without_the_back_offs_delay():
    # With 50 ms sleeps the back-off alone would notice a message at 0.4 s up to 40 ms late.
    comm = LateMessageComm(after=0.4)
    transport = Transport(comm, max_sleep=0.05)
    received = transport.recv_object(tag=12, due=comm.visible_at)
    late = time.perf_counter() - comm.visible_at
    assert received.payload == "report"
    assert late < 0.015
    assert comm.probes < 500  # fine polling lasts from 2 ms before the message, not the whole wait


def test_a_set_up_collective_names_the_rank_that_never_arrives_and_its_host():
    root = Transport(FakeComm(0, 3, arrive=(1,)))
    root.bound, root.hosts = 0.05, ["node-a", "node-b", "node-c"]
    with pytest.raises(TransportTimeout, match=r"rank 0 of 3 on \S+, set-up: no agreement of every rank within 0.05 s "
                                               r"\(waiting for rank 2 on host node-c\)"):
        root.allgather("no error")  # no timeout given: the transport's bound applies
    assert "Bcast" not in root.comm.calls  # nothing blocking was entered


def test_a_failure_notice_ends_a_wait_naming_the_rank_that_failed():
    comm = FakeComm(1, 3, answer_after=None)
    notice = pickle.dumps((0, "node-a", "RuntimeError: callback broke"))
    comm.Iprobe = lambda source, tag, status: tag == TAG_FAILED and (status.Set_source(0) or
                                                                     status.Set_elements(_byte(), len(notice)) or True)
    comm.Recv = lambda buf, source, tag, status=None: buf[0].__setitem__(slice(None), notice)
    with pytest.raises(PeerFailure, match=r"rank 0 \(the scheduler\) on host node-a failed: RuntimeError: callback"):
        Transport(comm).broadcast(np.zeros(2, np.float32), timeout=5.0)  # waits for "proceed", sleeps, checks


@pytest.mark.parametrize("verb", ["reduce_sum", "reduce_broadcast"])
def test_a_sum_into_a_buffer_that_is_not_contiguous_is_refused_before_any_rank_is_waited_for(verb):
    comm = FakeComm(0, 3)  # no rank has arrived: a wait would run out
    columns = np.zeros((4, 3), np.float32)[:, 0]
    with pytest.raises(ValueError, match=r"one contiguous array\. Received: an array of shape \(4,\) with strides"):
        getattr(Transport(comm), verb)(columns)
    assert comm.calls == []
