"""Readiness hand-shakes: bulk payloads move only once every participant is known to be there.

A bulk transfer polled with sleeps stalls between the polls (a 1.85 MB
``MPI_Ireduce`` took 1.1 s where a blocking ``MPI_Reduce`` took 0.4 ms), so:

* collectives: each rank sends the root an empty "arrived" message and sleeps
  until the root answers "proceed", which it does once all have arrived; each
  confirms with "going", and every rank calls the blocking collective (the root
  once all have confirmed);
* point to point, from ``announce_bytes`` on: the sender sends an empty
  announcement on the payload's tag and sleeps until the receiver answers
  "clear"; then the sender's blocking send meets the receiver's blocking receive.

These small messages have their own tags (or are empty on the payload's tag,
which no payload is) and carry no bytes, so they are neither confused with
other messages nor counted as traffic.
"""

from __future__ import annotations

from typing import Any

from mpi_trainer.comm.waits import NOTHING, PolledWaits

# The transport's own hand-shake tags. Message tags belong to mpi_trainer.comm.protocol, which keeps
# below FIRST_TRANSPORT_TAG; the transport's verbs take the caller's tag.
FIRST_TRANSPORT_TAG = 17
TAG_ARRIVED = 17  # collective readiness: a rank reached the collective (to the root)
TAG_PROCEED = 18  # collective readiness: every rank arrived (from the root)
TAG_CLEAR = 19  # point to point: the receiver is ready for an announced payload
TAG_GOING = 20  # collective readiness: a rank got "proceed" and enters the collective (to the root)

# Point-to-point payloads from this size on are announced and sent once the
# receiver is ready. Below it Open MPI sends eagerly (its TCP eager limit is
# 64 KiB), and the handshake's two extra messages would cost more than they save.
ANNOUNCE_BYTES = 32 * 1024


class Handshakes(PolledWaits):
    """The hand-shakes of the MPI transport (a mixin of :class:`~mpi_trainer.comm.transport.Transport`)."""

    def _send_nothing(self, dest: int, tag: int) -> None:
        """An empty message: MPI sends it eagerly, so the request is complete when posted."""
        self.comm.Isend([NOTHING, self._mpi.BYTE], dest, tag).Wait()

    def _gather_nothing(self, others: set[int], tag: int, timeout: float | None, what: str) -> None:
        """Root: sleep until every rank in ``others`` has sent it an empty message on ``tag``."""
        heard: set[int] = set()
        status = self._mpi.Status()

        def everyone() -> bool:
            while len(heard) < len(others) and self.comm.Iprobe(self._mpi.ANY_SOURCE, tag, status):
                self.comm.Recv([NOTHING, self._mpi.BYTE], status.Get_source(), tag)
                heard.add(status.Get_source())
            return len(heard) == len(others)

        self._poll(everyone, timeout, what, lambda: sorted(others - heard))

    def _rendezvous(self, root: int, timeout: float | None, what: str) -> None:
        """Return once every rank of the communicator is at this collective, ready to move the payload.

        Three steps, each rank's waits sleeping: all tell the root they arrived; the
        root tells all to proceed; all confirm. The root enters the blocking collective
        only after the confirmations, so a rank stopped while it waited (a fast worker
        waiting for a slow one) is named by the timeout instead of hanging the root.
        """
        if self._blocking(timeout) or self.size == 1:
            return
        if self.rank != root:
            self._send_nothing(root, TAG_ARRIVED)
            self._wait_for_peer(root, TAG_PROCEED, timeout, what)
            self._send_nothing(root, TAG_GOING)
            return
        others = set(range(self.size)) - {root}
        self._gather_nothing(others, TAG_ARRIVED, timeout, what)
        for rank in sorted(others):
            self._send_nothing(rank, TAG_PROCEED)
        self._gather_nothing(others, TAG_GOING, timeout, what)

    def _announce(self, dest: int, tag: int, timeout: float | None, what: str) -> None:
        """Sender: tell ``dest`` a large payload is coming on ``tag``; sleep until it is ready for it."""
        if self._blocking(timeout):
            return
        self._send_nothing(dest, tag)
        self._wait_for_peer(dest, TAG_CLEAR, timeout, what)

    def _accept(self, status: Any, tag: int, timeout: float | None) -> Any:
        """Receiver: take the announcement ``status`` describes, clear the sender, probe the payload.

        The payload follows within one of the sender's polling sleeps; the probe
        still sleeps and times out, for a sender stopped before it sent.
        """
        sender = status.Get_source()
        self.comm.Recv([NOTHING, self._mpi.BYTE], sender, tag)
        self._send_nothing(sender, TAG_CLEAR)
        return self._probe(sender, tag, timeout)

    def _receive_status(self, source: int, tag: int, timeout: float | None, expected: int = -1,
                        due: float | None = None) -> Any:
        """The status of the next payload on ``tag``, after accepting an announcement if one comes first."""
        status = self._probe(source, tag, timeout, due)
        if status.Get_count(self._mpi.BYTE) == 0 and expected != 0:
            status = self._accept(status, tag, timeout)
        return status
