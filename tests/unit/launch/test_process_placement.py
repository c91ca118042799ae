"""A process is placed once: a backend that started early, ``mpi_trainer.init``'s placement kept by later
jobs, and the abort hook that a refused job must not leave behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mpi_trainer.comm.local import LocalTransport, LocalWorld
from mpi_trainer.comm.transport import abort_on_error, install_abort_on_error
from mpi_trainer.config import load_config
from mpi_trainer.errors import AgreedInputError, ConfigError
from mpi_trainer.launch.devices import GpuInventory, RankPlacement, refuse_started_backend
from mpi_trainer.launch.process_placement import PlacedProcess, follow_placement, place_or_follow
from mpi_trainer.launch.runtime import worker_cores

PLACED = {"device": "auto", "scheduler_device": "cpu", "threads": 1, "bind_cores": True}


def single_rank() -> LocalTransport:
    return LocalTransport(LocalWorld(1), 0)


def test_a_later_job_takes_the_placement_where_its_config_leaves_the_defaults():
    cfg = follow_placement(single_rank(), load_config(None, ["train.epochs=3"]), PLACED)
    assert (cfg.train.device, cfg.train.scheduler_device, cfg.train.threads) == ("auto", "cpu", 1)
    assert cfg.train.epochs == 3


def test_a_later_job_that_asks_for_other_threads_or_devices_is_refused():
    with pytest.raises(AgreedInputError, match=r"`train.threads` differs from the placement this process already "
                                               r"has: .* Received: train.threads=4; expected 1"):
        follow_placement(single_rank(), load_config(None, ["train.threads=4"]), PLACED)
    with pytest.raises(AgreedInputError, match=r"Received: train.device='gpu'; expected 'auto'"):
        follow_placement(single_rank(), load_config(None, ["train.device=gpu"]), PLACED)


def test_a_backend_started_on_a_node_with_gpus_is_refused_and_on_one_without_it_is_not():
    placement = RankPlacement(2, "node01", 1, "worker", "tensorflow", "cuda:1", "1")
    with pytest.raises(ConfigError, match=r"rank 2 on node01: the Keras backend 'tensorflow' started before "
                                          r"mpi_trainer dealt this node's 4 GPUs .* expected `mpi_trainer.init\(\)`"):
        refuse_started_backend(placement, GpuInventory(["0", "1", "2", "3"]))
    refuse_started_backend(RankPlacement(2, "node01", 1, "worker", "tensorflow", "cpu"), GpuInventory([]))


def test_a_placement_names_its_threads_once_they_are_sized():
    placement = RankPlacement(1, "node01", 0, "worker", "jax", "cpu")
    assert placement.describe() == "rank 1 on node01: jax, cpu"
    sized = RankPlacement(1, "node01", 0, "worker", "jax", "cpu", threads=1)
    assert sized.describe() == "rank 1 on node01: jax, cpu, 1 thread"


PROBE = """
import sys
from mpi_trainer.launch.devices import backend_started
backend = sys.argv[1]
import keras
print(backend_started(backend))
keras.ops.convert_to_numpy(keras.ops.ones((2,)) + 1)  # the runtime runs an op
print(backend_started(backend))
"""


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_a_backend_counts_as_started_once_it_ran_an_op_not_when_keras_is_imported(backend):
    pytest.importorskip(backend)
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", PROBE, backend], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout.split()
    assert out[-2:] == ["False", "True"]


def test_installing_the_abort_hook_again_keeps_the_users_hook_reachable(monkeypatch):
    def users_hook(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", users_hook)
    transport = single_rank()
    install_abort_on_error(transport)
    install_abort_on_error(transport)  # a second job in the same process
    assert sys.excepthook is not users_hook and sys.excepthook.previous is users_hook


def test_the_abort_hook_lasts_the_job_and_an_escaping_error_keeps_it(monkeypatch):
    def users_hook(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", users_hook)
    transport = single_rank()
    with abort_on_error(transport):
        assert sys.excepthook.previous is users_hook
    assert sys.excepthook is users_hook  # the script's code after the job is its own
    with pytest.raises(AgreedInputError), abort_on_error(transport):
        raise AgreedInputError("refused on every rank")
    assert sys.excepthook is users_hook  # every rank ends by the exception itself
    with pytest.raises(RuntimeError), abort_on_error(transport):
        raise RuntimeError("a bug on one rank")
    assert sys.excepthook.previous is users_hook  # uncaught, it must still end every rank


def test_the_abort_hook_init_leaves_for_the_scripts_code_before_fit_ends_with_fit(monkeypatch):
    def users_hook(*args):
        pass

    monkeypatch.setattr(sys, "excepthook", users_hook)
    transport = single_rank()
    install_abort_on_error(transport)  # as init() leaves it: a rank failing before fit ends every rank
    with abort_on_error(transport):  # fit
        assert sys.excepthook.previous is users_hook
    assert sys.excepthook is users_hook  # after fit, the script's own hook


def test_each_worker_of_a_node_keeps_to_its_own_run_of_cores():
    node = [0, 1, 2, 3, 4]  # the scheduler and four workers filling 8 cores, 2 threads each
    cores = list(range(8))
    assert [worker_cores(rank, node, 2, cores) for rank in (1, 2, 3, 4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert worker_cores(0, node, 8, cores) is None  # the scheduler stays free
    assert worker_cores(5, [2, 5], 1, [4, 9]) == [9]  # a second node: its own workers, the cores it may use
    assert worker_cores(1, node, 3, cores) is None  # 4 x 3 threads do not fit on 8 cores: nobody binds
    assert worker_cores(1, node, 1, cores) is None  # 4 x 1 leave room for more workers: they stay free
    assert worker_cores(3, [0, 1, 2, 3], 5, list(range(16))) == [10, 11, 12, 13, 14]  # 1 core spare: bound


def test_a_placed_process_is_followed_and_kept_by_its_caller_not_placed_again():
    placed = PlacedProcess(placements=[], settings=PLACED)
    cfg, kept = place_or_follow(single_rank(), load_config(None, ["train.epochs=3"]), placed)
    assert kept is placed and cfg.train.threads == 1 and cfg.train.epochs == 3
    with pytest.raises(AgreedInputError, match=r"Received: train.threads=4; expected 1"):
        place_or_follow(single_rank(), load_config(None, ["train.threads=4"]), placed)


@pytest.mark.parametrize("backend, method, bound", [("jax", "synchronous", None), ("jax", "average", [1]),
                                                    ("tensorflow", "synchronous", [1])])
def test_a_jax_worker_of_synchronous_sgd_is_not_held_to_one_core(monkeypatch, backend, method, bound):
    """Its per-step sum's host callback needs a second thread of JAX's CPU client, which has one a core."""
    from mpi_trainer.launch import process_placement

    monkeypatch.setattr(process_placement, "allowed_cores", lambda: [0, 1])
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: None)
    placement = RankPlacement(rank=2, host="h", local_rank=2, role="worker", backend=backend, device="cpu")
    cfg = load_config(None, [f"aggregation.method={method}"])
    placed = process_placement.bind_to_cores(placement, cfg, 2, [0, 1, 2], 1)
    assert placed.cores == bound
