"""What ``fault.survive`` needs from MPI and from the mpirun line, checked in one process."""

from __future__ import annotations

import pytest

from mpi_trainer.comm.accounting import RankAccounting
from mpi_trainer.comm.failures import fault_tolerance_problem, prepare_mpi_environment
from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS, mpirun_command

FT_ENV = {"OMPI_MCA_mpi_ft_enable": "1", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "tcp,self"}


def test_the_fault_tolerant_options_pass_the_check():
    assert fault_tolerance_problem(FT_ENV) is None


@pytest.mark.parametrize("environ, missing", [
    ({}, "without fault-tolerant MPI"),
    ({**FT_ENV, "OMPI_MCA_btl": "self,sm,tcp"}, "--mca btl self,sm,tcp; expected --mca pml ob1 --mca btl tcp,self"),
    ({**FT_ENV, "OMPI_MCA_btl": "^openib"}, "expected --mca pml ob1 --mca btl tcp,self"),
    ({k: v for k, v in FT_ENV.items() if k != "OMPI_MCA_pml"}, "--mca pml (default)"),
])
def test_a_job_started_without_them_is_told_what_is_missing(environ, missing):
    assert missing in fault_tolerance_problem(environ)


def test_launch_adds_the_options_only_for_fault_survive():
    plain = mpirun_command(3, ["train", "c.toml"])
    tolerant = mpirun_command(3, ["train", "c.toml"], fault_tolerant=True)
    assert "--with-ft" not in plain
    at = tolerant.index("--with-ft")
    assert tolerant[at:at + len(FAULT_TOLERANT_OPTIONS)] == FAULT_TOLERANT_OPTIONS
    assert tolerant.index("--with-ft") < tolerant.index("-m")  # mpirun's options, before the program


def test_a_shrink_renumbers_the_survivors_and_names_the_lost_by_their_starting_rank():
    ranks = [RankAccounting(rank, 5, "h") for rank in range(5)]
    for accounting in ranks:
        accounting.hosts = [f"h{index}" for index in range(5)]
    first = ranks[3].renumber([0, 1, 3, 4])  # rank 2 lost
    assert (first.lost, first.lost_world, ranks[3].rank, ranks[3].size) == ([2], [2], 2, 4)
    second = ranks[3].renumber([0, 2, 3])  # now rank 1 lost: it started as rank 1
    assert (second.lost, second.lost_world, ranks[3].rank, ranks[3].world_ranks) == ([1], [1], 1, [0, 3, 4])
    assert ranks[3].hosts == ["h0", "h3", "h4"]  # a timeout names the right host after the shrinks


def test_under_fault_tolerant_mpi_the_survivors_finalize_without_the_runtimes_fence():
    tolerant, plain, chosen = dict(FT_ENV), {"OMPI_MCA_pml": "ob1"}, {**FT_ENV, "OMPI_MCA_async_mpi_finalize": "0"}
    for environ in (tolerant, plain, chosen):
        prepare_mpi_environment(environ)
    assert tolerant["OMPI_MCA_async_mpi_finalize"] == "1"
    assert "OMPI_MCA_async_mpi_finalize" not in plain
    assert chosen["OMPI_MCA_async_mpi_finalize"] == "0"  # the user's own setting is kept


def test_importing_the_transport_changes_no_environment(monkeypatch):
    import importlib
    import os

    import mpi_trainer.comm

    monkeypatch.setenv("OMPI_MCA_mpi_ft_enable", "1")
    monkeypatch.delenv("OMPI_MCA_async_mpi_finalize", raising=False)
    importlib.reload(mpi_trainer.comm)
    assert "OMPI_MCA_async_mpi_finalize" not in os.environ
