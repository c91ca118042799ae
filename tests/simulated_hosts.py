"""Simulated hosts for the multi-host tests, built and removed by ``scripts/local_cluster.sh``.

Each test process gets its own interface prefix and /24, so engineers sharing a machine can run
the multi-host tests at the same time. ``down`` runs whatever happens in the test body.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "local_cluster.sh"
EXIT_NO_RIGHTS = 77  # the script's status when it cannot create namespaces here


@dataclass
class Hosts:
    names: list[str]
    prefix: str
    subnet: str
    mpirun_args: list[str]
    settings: dict[str, str]  # the script's cluster.env: bandwidth, burst_bytes, ...


def unique_prefix() -> tuple[str, str]:
    """An interface prefix and a /24 no other test process on this machine uses."""
    tag = os.getpid() % 100000
    return f"mpt{tag}", f"10.88.{20 + tag % 200}.0/24"


def cluster_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


STATE_ROOT = Path(os.environ.get("MPT_CLUSTER_ROOT", "/run/mpi_trainer-cluster"))


def state_dir(prefix: str) -> Path:
    """The state directory ``up`` made for ``prefix`` (its name ends in random characters); a path that
    does not exist when there is none."""
    found = sorted(STATE_ROOT.glob(f"{prefix}.*"))
    return found[0] if found else STATE_ROOT / f"{prefix}.none"


def leftovers(prefix: str) -> list[str]:
    """Interfaces and namespaces with this prefix that still exist."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    names += [line.split()[0] for line in spaces.splitlines() if line.strip()]
    return sorted(name for name in names if name.startswith(prefix))


def _read_hosts(prefix: str, subnet: str) -> Hosts:
    state = state_dir(prefix)
    settings = dict(line.split("=", 1) for line in (state / "cluster.env").read_text().splitlines())
    names = [line.split()[0] for line in (state / "machinefile").read_text().splitlines()]
    return Hosts(names, prefix, subnet, (state / "mpirun_args").read_text().split("\n")[:-1], settings)


@contextmanager
def simulated_hosts(count: int, *options: str) -> Iterator[Hosts]:
    """``local_cluster.sh up count options...``; skips only where namespaces cannot be created."""
    prefix, subnet = unique_prefix()
    up = cluster_script("up", str(count), "--prefix", prefix, "--subnet", subnet, *options)
    try:
        if up.returncode == EXIT_NO_RIGHTS:
            pytest.skip(f"simulated hosts cannot be created here: {up.stderr.strip()}")
        assert up.returncode == 0, up.stdout + up.stderr
        yield _read_hosts(prefix, subnet)
    finally:
        down = cluster_script("down", "--prefix", prefix)
        assert down.returncode == 0, down.stdout + down.stderr
