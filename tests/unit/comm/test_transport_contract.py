"""The in-process transport keeps the transport contract (the MPI one: tests/mpirun/test_mpirun_contract.py)."""

from __future__ import annotations

import inspect

import pytest
from transport_contract import exchange, expected

from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.comm.local import LocalTransport, LocalWorld
from mpi_trainer.comm.transport import Transport


@pytest.mark.parametrize("size", [2, 3])
def test_every_verb_gives_what_the_contract_expects(size):
    world = LocalWorld(size)
    transports = world.transports()
    seen = world.run({rank: (lambda rank=rank: exchange(transports[rank])) for rank in range(size)}, timeout=60)
    assert {rank: seen[rank] for rank in range(size)} == {rank: expected(rank, size) for rank in range(size)}


@pytest.mark.parametrize("cls", [Transport, LocalTransport])
def test_both_transports_offer_every_verb_with_the_same_parameters(cls):
    for name, member in inspect.getmembers(RankTransport, inspect.isfunction):
        if name.startswith("_"):
            continue
        assert hasattr(cls, name), f"{cls.__name__} lacks {name}"
        wanted = list(inspect.signature(member).parameters)
        assert list(inspect.signature(getattr(cls, name)).parameters) == wanted, (cls.__name__, name)
    assert isinstance(LocalWorld(2).transports()[0], RankTransport)
