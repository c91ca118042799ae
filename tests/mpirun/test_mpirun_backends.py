"""Real mpirun jobs off TensorFlow (JAX in CI; PyTorch where installed) and device placement on every rank.
(A GPU asked for on a node without one is refused on every rank: tests/unit/launch/test_agreement.py.)"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import MPI_TIMEOUT, ROOT, MpiResult, run_mpi


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


@pytest.mark.skipif(not installed("jax"), reason="jax is not installed")
def test_a_script_launched_with_synchronous_sgd_on_jax_keeps_its_workers_off_single_cores(tmp_path):
    """``launch --set aggregation.method=synchronous -- python script.py``: the script's ``init()`` places its
    rank before ``fit`` sees the method, so it takes launch's settings too; a JAX worker is then not held to
    one core, which ``fit`` would refuse (its per-step sum needs a second thread)."""
    run_dir = tmp_path / "script"
    command = [sys.executable, "-m", "mpi_trainer", "launch", "-n", "3", "--max-restarts", "0", "--run-dir",
               str(run_dir), "--set", "aggregation.method=synchronous", "--set", "train.bind_cores=true", "--",
               sys.executable, "tests/mpirun/launch_fit_job.py"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "KERAS_BACKEND": "jax", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=MPI_TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    summary = MpiResult(0, "", run_dir).summary()
    assert summary["rounds_completed"] == 8
    assert [p["cores"] for p in summary["placement"][1:]] == [None, None]
    assert "synchronous SGD: at every step" in (run_dir / "train.log").read_text()
