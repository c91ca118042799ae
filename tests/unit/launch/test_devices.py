"""Device placement without a GPU: fake environments, fake `nvidia-smi` output and fake driver directories."""

from __future__ import annotations

import json

import pytest

from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.devices import (
    GpuInventory,
    backend_environment,
    check_training_backend,
    choose_placement,
    configured_backend,
    confirm_placement,
    discover_gpus,
)

SMI_FOUR = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}aaa-bbbb)" for i in range(4)) + "\n"
FOUR = GpuInventory(["0", "1", "2", "3"], ["`nvidia-smi -L` (4 GPUs)"])
NONE = GpuInventory([], ["CUDA_VISIBLE_DEVICES (unset)", "`nvidia-smi -L` (not on PATH)",
                         "/proc/driver/nvidia/gpus (absent)"])


def smi(output: str):
    def run(command: list[str]) -> str:
        assert command == ["nvidia-smi", "-L"]
        return output
    return run


def test_visible_devices_set_by_the_batch_system_win_over_nvidia_smi(tmp_path):
    found = discover_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}, run=smi(SMI_FOUR), proc_dir=tmp_path)
    assert found.ids == ["2", "3"]
    for hidden in ("", "-1"):
        assert discover_gpus({"CUDA_VISIBLE_DEVICES": hidden}, run=smi(SMI_FOUR), proc_dir=tmp_path).ids == []


def test_nvidia_smi_lists_the_node_gpus_then_the_driver_directory_is_the_fallback(tmp_path):
    assert discover_gpus({}, run=smi(SMI_FOUR), proc_dir=tmp_path / "absent").ids == ["0", "1", "2", "3"]
    for bus in ("0000:17:00.0", "0000:65:00.0"):
        (tmp_path / bus).mkdir()
    found = discover_gpus({}, run=smi(""), proc_dir=tmp_path)  # nvidia-smi present but failing
    assert found.ids == ["0", "1"] and f"{tmp_path} (2 GPUs)" in found.looked


def test_a_node_without_gpus_says_where_it_looked(tmp_path):
    found = discover_gpus({}, run=None, proc_dir=tmp_path / "absent")
    if found.ids:  # this machine has nvidia-smi on PATH: the fake driver directory is not reached
        pytest.skip("nvidia-smi is installed here")
    assert found.looked == ["CUDA_VISIBLE_DEVICES (unset)", "`nvidia-smi -L` (not on PATH)",
                            f"{tmp_path / 'absent'} (absent)"]


def test_two_nodes_of_four_gpus_give_each_worker_its_own_gpu_and_the_scheduler_none():
    # mpirun -n 9 over node01 slots=5 and node02 slots=4: ranks 0-4 on node01, 5-8 on node02.
    nodes = {"node01": [0, 1, 2, 3, 4], "node02": [5, 6, 7, 8]}
    seen = {}
    for host, ranks in nodes.items():
        for rank in ranks:
            seen[rank] = choose_placement(rank, host, ranks, "auto", "cpu", FOUR, "jax")
    assert seen[0].device == "cpu" and seen[0].role == "scheduler"
    assert [seen[r].device for r in range(1, 9)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"] * 2
    assert seen[6].describe() == "rank 6 on node02: jax, cuda:1" and seen[6].local_rank == 1
    assert backend_environment(seen[0])["CUDA_VISIBLE_DEVICES"] == ""  # the scheduler cannot open a GPU


def test_more_workers_than_gpus_share_them_round_robin():
    ranks = list(range(7))
    devices = [choose_placement(r, "n", ranks, "gpu", "cpu", GpuInventory(["0", "1"]), "torch").device
               for r in ranks[1:]]
    assert devices == ["cuda:0", "cuda:1", "cuda:0", "cuda:1", "cuda:0", "cuda:1"]


def test_a_scheduler_on_gpu_is_dealt_the_first_gpu_and_the_workers_follow():
    ranks = [0, 1, 2]
    devices = [choose_placement(r, "n", ranks, "auto", "gpu", FOUR, "jax").device for r in ranks]
    assert devices == ["cuda:0", "cuda:1", "cuda:2"]


def test_auto_and_cpu_train_on_cpu_where_there_is_no_gpu_or_none_is_wanted():
    assert choose_placement(1, "n", [0, 1], "auto", "cpu", NONE, "tensorflow").device == "cpu"
    placement = choose_placement(1, "n", [0, 1], "cpu", "cpu", FOUR, "tensorflow")
    assert placement.device == "cpu" and backend_environment(placement) == {"CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.parametrize(("rank", "key"), [(1, "train.device"), (0, "train.scheduler_device")])
def test_gpu_on_a_node_without_one_fails_naming_the_host_and_what_was_looked_for(rank, key):
    with pytest.raises(ConfigError) as error:
        choose_placement(rank, "node03", [0, 1], "gpu", "gpu", NONE, "jax")
    text = str(error.value)
    assert "node03" in text and f"Received: {key}='gpu'" in text
    assert "nvidia-smi -L` (not on PATH)" in text and "/proc/driver/nvidia/gpus (absent)" in text


def test_each_backend_shares_a_gpu_by_growing_its_memory_and_a_users_choice_stays():
    def env(backend, environ=None):
        placement = choose_placement(2, "n", [0, 1, 2], "gpu", "cpu", FOUR, backend)
        return backend_environment(placement, environ or {})

    assert env("tensorflow") == {"CUDA_VISIBLE_DEVICES": "1", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert env("jax") == {"CUDA_VISIBLE_DEVICES": "1", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert env("torch") == {"CUDA_VISIBLE_DEVICES": "1"}
    assert env("jax", {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".2"}) == {"CUDA_VISIBLE_DEVICES": "1"}
    cpu = choose_placement(0, "n", [0, 1], "gpu", "cpu", FOUR, "jax")
    assert backend_environment(cpu) == {"CUDA_VISIBLE_DEVICES": "", "JAX_PLATFORMS": "cpu"}


def test_a_backend_that_cannot_see_the_chosen_gpu_falls_back_on_auto_and_fails_on_gpu():
    placement = choose_placement(1, "node02", [0, 1], "gpu", "cpu", FOUR, "jax")
    assert confirm_placement(placement, "gpu", lambda backend: True) is placement
    assert confirm_placement(placement, "auto", lambda backend: False).device == "cpu"
    with pytest.raises(ConfigError, match=r"node02 has GPU 0, but the Keras backend 'jax' sees no GPU"):
        confirm_placement(placement, "gpu", lambda backend: False)


def test_the_backend_comes_from_keras_backend_then_keras_json(tmp_path):
    assert configured_backend({"KERAS_BACKEND": "torch", "KERAS_HOME": str(tmp_path)}) == "torch"
    assert configured_backend({"KERAS_HOME": str(tmp_path)}) == "tensorflow"
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax"}))
    assert configured_backend({"KERAS_HOME": str(tmp_path)}) == "jax"


def test_backends_that_cannot_train_or_are_missing_fail_before_training():
    with pytest.raises(ConfigError, match=r"Received: KERAS_BACKEND='numpy'; expected one of"):
        check_training_backend("numpy", lambda module: True)
    with pytest.raises(ConfigError, match=r"'jax' is not installed \(pip install 'mpi_trainer\[jax\]'\)"):
        check_training_backend("jax", lambda module: module != "jax")
    check_training_backend("torch", lambda module: module == "torch")
