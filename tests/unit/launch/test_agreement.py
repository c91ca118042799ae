"""Set-up failures agreed on by every rank of an in-process world: all ranks fail together, none waits,
bad input is one line everywhere and a bug keeps its traceback where it happened."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.errors import AgreedInputError, ConfigError
from mpi_trainer.launch.agreement import check_fault_tolerance, check_world, load_config_everywhere


def on_every_rank(size: int, step: Callable[[Any], Any]) -> dict[int, BaseException | Any]:
    """What ``step(transport)`` raised (or returned) on each rank of a world of ``size`` ranks."""
    world = LocalWorld(size)
    transports = world.transports()

    def role(rank: int) -> Any:
        try:
            return step(transports[rank])
        except Exception as exc:  # noqa: BLE001 - each rank's outcome is what the test checks
            return exc

    return world.run({rank: lambda rank=rank: role(rank) for rank in range(size)}, timeout=60)


def test_a_bad_config_fails_every_rank_with_its_one_line_message():
    outcome = on_every_rank(3, lambda t: load_config_everywhere(t, "configs/quickstart.toml", ["train.batch_size=0"]))
    message = "`train.batch_size` must be > 0. Received: train.batch_size=0"
    assert all(isinstance(exc, AgreedInputError) for exc in outcome.values())
    assert [str(outcome[rank]) for rank in range(3)] == [message, *[f"{message} (reported by rank 0)"] * 2]


def test_lbfgs_refuses_ssp_on_every_rank():
    outcome = on_every_rank(3, lambda t: load_config_everywhere(t, "configs/digits_lbfgs.toml", ["aggregation.ssp=1"]))
    assert all(isinstance(exc, AgreedInputError) and "`aggregation.ssp` is not available with "
               "model.optimizer='lbfgs'" in str(exc) for exc in outcome.values()), outcome


def test_bad_input_on_one_rank_fails_the_others_naming_that_rank():
    def step(transport: Any) -> Any:
        overrides = ["train.batch_size=0"] if transport.rank == 2 else []
        return load_config_everywhere(transport, "configs/quickstart.toml", overrides)

    outcome = on_every_rank(3, step)
    assert str(outcome[2]) == "`train.batch_size` must be > 0. Received: train.batch_size=0"
    for rank in (0, 1):
        assert str(outcome[rank]) == f"{outcome[2]} (reported by rank 2)"


def test_a_single_rank_is_told_it_needs_a_worker():
    (exc,) = on_every_rank(1, check_world).values()
    assert isinstance(exc, ConfigError)
    assert "needs at least one worker rank" in str(exc) and "Received: 1 rank" in str(exc)


def test_fault_survive_is_refused_on_every_rank_without_fault_tolerant_mpi(monkeypatch):
    monkeypatch.delenv("OMPI_MCA_mpi_ft_enable", raising=False)  # as a plain `mpirun` starts the job
    cfg = load_config_everywhere(LocalWorld(1).transports()[0], "configs/quickstart.toml", ["fault.survive=true"])
    outcome = on_every_rank(3, lambda t: check_fault_tolerance(t, cfg))
    for exc in outcome.values():
        assert isinstance(exc, AgreedInputError), outcome
        assert "`fault.survive` = True needs fault-tolerant MPI" in str(exc) and "--with-ft ulfm" in str(exc)


def broken_user_layer() -> None:
    raise ValueError("a bug in the user's layer")


def test_asking_for_a_gpu_on_a_node_without_one_fails_on_every_rank_before_training(monkeypatch):
    from mpi_trainer.launch.process_placement import place_rank

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # an empty list hides every GPU, whatever this machine has
    cfg = load_config_everywhere(LocalWorld(1).transports()[0], "configs/quickstart.toml", ["train.device='gpu'"])
    outcome = on_every_rank(3, lambda t: place_rank(t, cfg, [0, 1, 2]))
    assert all(isinstance(exc, AgreedInputError) for exc in outcome.values()), outcome
    for exc in outcome.values():
        assert "asks for a GPU but node" in str(exc) and "looked at CUDA_VISIBLE_DEVICES=''" in str(exc)
        assert "Received: train.device='gpu'" in str(exc)
