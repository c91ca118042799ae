"""Two simulated hosts (network namespaces on a bridge) running one real job across them.

The test creates and removes its own namespaces; it skips where it lacks the rights.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_mpi

AGENT = """#!/bin/sh
host="$1"; shift
exec ip netns exec "$host" unshare --uts sh -c "hostname $host; $*"
"""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class Cluster:
    """Namespaces ``<prefix>h0..`` joined by bridge ``<prefix>br`` on 10.77.<net>.0/24."""

    def __init__(self, hosts: int) -> None:
        tag = os.getpid() % 100000
        self.prefix = f"mt{tag}"
        self.subnet = f"10.77.{tag % 250}.0/24"
        self.hosts = [f"{self.prefix}h{i}" for i in range(hosts)]
        self.created: list[tuple[str, str]] = []

    def _address(self, last: int) -> str:
        return self.subnet.replace(".0/24", f".{last}/24")

    def up(self) -> None:
        bridge = f"{self.prefix}br"
        _ip("link", "add", bridge, "type", "bridge")
        self.created.append(("link", bridge))
        _ip("addr", "add", self._address(254), "dev", bridge)
        _ip("link", "set", bridge, "up")
        for index, host in enumerate(self.hosts, start=1):
            outside, inside = f"{self.prefix}v{index}", f"{self.prefix}p{index}"
            _ip("netns", "add", host)
            self.created.append(("netns", host))
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self.created.append(("link", outside))
            _ip("link", "set", inside, "netns", host)
            _ip("link", "set", outside, "master", bridge, "up")
            _ip("-n", host, "addr", "add", self._address(index), "dev", inside)
            _ip("-n", host, "link", "set", inside, "up")
            _ip("-n", host, "link", "set", "lo", "up")

    def down(self) -> None:
        for kind, name in reversed(self.created):
            _ip("netns", "del", name, check=False) if kind == "netns" else _ip("link", "del", name, check=False)


@pytest.fixture
def two_hosts(tmp_path: Path):
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("simulated hosts need root, iproute2 and unshare")
    cluster = Cluster(2)
    try:
        cluster.up()
    except subprocess.CalledProcessError as exc:
        cluster.down()
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT)
    agent.chmod(0o755)
    machinefile = tmp_path / "hosts"
    machinefile.write_text(f"{cluster.hosts[0]} slots=2\n{cluster.hosts[1]} slots=1\n")
    yield cluster, machinefile, agent
    cluster.down()


def test_a_job_spans_two_hosts_with_per_node_threads(two_hosts, tmp_path):
    cluster, machinefile, agent = two_hosts
    subnet = cluster.subnet
    result = run_mpi(3, ["train", "configs/quickstart.toml", "--set", "train.epochs=2", "--set", "log.verbosity=2"],
                     tmp_path / "run", timeout=180, machinefile=str(machinefile),
                     mpirun_args=["--prtemca", "plm_ssh_agent", str(agent), "--mca", "btl_tcp_if_include", subnet,
                                  "--prtemca", "prte_if_include", subnet])
    assert result.returncode == 0, result.output
    first, second = cluster.hosts
    assert f"[rank 1/3 {first}]" in result.output and f"[rank 2/3 {second}]" in result.output
    # Worker 1 shares its node with the scheduler only; worker 2 is alone on the second node.
    assert "ranks on this node: [0, 1]" in result.output and "ranks on this node: [2]" in result.output
    summary = result.summary()
    assert summary["rounds_completed"] == 2 and summary["workers"] == 2
    for row in result.rounds():
        assert int(row["bytes"]) >= 4 * summary["model_bytes"]
