"""Chunked data arrays over MPI, on a one-rank communicator (no mpirun needed)."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.comm.transport import Transport


@pytest.fixture
def transport() -> Transport:
    from mpi4py import MPI

    return Transport(MPI.COMM_SELF)


@pytest.mark.parametrize("array", [
    np.arange(1000, dtype=np.float32).reshape(10, 10, 10),
    np.arange(77, dtype=np.int64),
    np.empty((0, 4), dtype=np.float32),
])
def test_arrays_arrive_whole_through_small_chunks(transport, array):
    transport.max_message_bytes = 96  # forces many chunks; below any eager limit, so self-send completes
    transport.send_large_array(array, 0)
    received = transport.recv_large_array(0)
    assert received.dtype == array.dtype and received.shape == array.shape
    np.testing.assert_array_equal(received, array)
    assert transport.take_bytes() >= array.nbytes  # counted as traffic

