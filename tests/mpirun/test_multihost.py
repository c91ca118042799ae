"""Two simulated hosts (network namespaces on a bridge, from scripts/local_cluster.sh) running one job.

Skips only where namespaces cannot be created (no root or no iproute2).
"""

from __future__ import annotations

from conftest import run_mpi
from simulated_hosts import simulated_hosts


def test_a_job_spans_two_hosts_with_per_node_threads(tmp_path):
    with simulated_hosts(2, "--slots", "2,1") as hosts:
        result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=2",
                             "--set", "log.verbosity=2"],
                         tmp_path / "run", timeout=180, mpirun_args=hosts.mpirun_args)
    assert result.returncode == 0, result.output
    first, second = hosts.names
    assert f"[rank 1/3 {first}]" in result.output and f"[rank 2/3 {second}]" in result.output
    # Worker 1 shares its node with the scheduler only; worker 2 is alone on the second node.
    assert "ranks on this node: [0, 1]" in result.output and "ranks on this node: [2]" in result.output
    summary = result.summary()
    assert summary["rounds_completed"] == 2 and summary["workers"] == 2
    for row in result.rounds():
        assert int(row["bytes"]) >= 4 * summary["model_bytes"]
