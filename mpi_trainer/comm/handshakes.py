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
other messages nor counted as traffic. The hand-shakes themselves are
:class:`~mpi_trainer.comm.transport.Transport`'s; this module holds their tags and threshold.
"""

from __future__ import annotations

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
