"""Real mpirun jobs off TensorFlow (JAX in CI; PyTorch where installed) and device placement on every rank.
(A GPU asked for on a node without one is refused on every rank: tests/unit/launch/test_agreement.py.)"""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import run_mpi


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


BACKENDS = [
    pytest.param("jax", marks=pytest.mark.skipif(not installed("jax"), reason="jax is not installed "
                                                 "(pip install -e '.[jax]'; scripts/test.sh installs it)")),
    pytest.param("torch", marks=pytest.mark.skipif(not installed("torch"), reason="torch is not installed: "
                                                   "its PyPI wheel with CUDA libraries is several GB, too large "
                                                   "for CI here; install torch to run this test")),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_job_trains_on_the_backend_and_logs_where_each_rank_ran(backend, tmp_path):
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=2", "--set", "checkpoint.every=1"],
                     tmp_path / "run", extra_env={"KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.output[-3000:]
    summary = result.summary()
    assert summary["rounds_completed"] == 2 and summary["final_test_accuracy"] > 0.5
    placement = summary["placement"]
    assert [(p["rank"], p["role"], p["backend"], p["device"]) for p in placement] == [
        (0, "scheduler", backend, "cpu"), (1, "worker", backend, "cpu"), (2, "worker", backend, "cpu")]
    cores = os.cpu_count()
    per_worker = max(1, cores // 2)
    assert [p["threads"] for p in placement] == [cores, per_worker, per_worker]
    # train.bind_cores: each worker on its own cores, the scheduler free
    assert [p["cores"] for p in placement] == [None, list(range(per_worker)), list(range(per_worker, 2 * per_worker))]
    log = (result.run_dir / "train.log").read_text()
    for p in placement[1:]:
        assert f"rank {p['rank']} on {p['host']}: {backend}, cpu, {p['threads']} thread" in log
    scheduler = f"rank 0 (scheduler) on {placement[0]['host']}: {backend}, cpu, {cores} threads"
    assert f"{scheduler} (aggregates in NumPy, evaluates on cpu)" in log


@pytest.mark.parametrize("backend", [pytest.param("tensorflow"), *BACKENDS[:1]])
def test_synchronous_sgd_trains_in_separate_processes_and_a_jax_worker_keeps_a_core_for_its_sum(backend, tmp_path):
    """Every worker sums its gradients with the others' at each step, across processes. JAX's CPU client has a
    thread a core the process may use, and the sum's host callback takes one besides the step's: a JAX worker is
    not bound to a single core, where the two waited on each other for good (a job at 0 % CPU)."""
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=3",
                         "--set", "aggregation.method=synchronous", "--set", "checkpoint.every=0"],
                     tmp_path / "run", extra_env={"KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert result.returncode == 0, result.output[-3000:]
    summary = result.summary()
    assert summary["rounds_completed"] == 3 and summary["final_test_accuracy"] > 0.8
    workers = summary["placement"][1:]
    if backend == "jax" and all(p["threads"] == 1 for p in workers):
        assert [p["cores"] for p in workers] == [None, None]
    log = (result.run_dir / "train.log").read_text()
    assert "synchronous SGD: at every step the workers' gradients are summed" in log
