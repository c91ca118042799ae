"""scripts/local_cluster.sh: argument errors, idempotent up, state-file teardown, netem detection.

These need no mpirun; the ones that create namespaces skip where the script reports missing rights.
"""

from __future__ import annotations

import subprocess

import pytest
from simulated_hosts import EXIT_NO_RIGHTS, cluster_script, leftovers, state_dir, unique_prefix


@pytest.mark.parametrize("args, expected", [
    (["up", "0"], "Received: up 0; expected up N with 1 <= N <= 200"),
    (["up", "2", "--bandwidth", "fast"], "Received: --bandwidth=fast; expected an integer with bit"),
    (["up", "2", "--delay", "5"], "Received: --delay=5; expected an integer with us, ms or s"),
    (["up", "2", "--prefix", "much_too_long"], "Received: --prefix=much_too_long"),
    (["up", "2", "--subnet", "8.8.8.0/24"], "Received: --subnet=8.8.8.0/24; expected e.g. 10.88.0.0/24"),
    (["up", "2", "--slots", "2,0"], "Received: --slots=2,0"),
    (["up", "2", "--colour", "red"], "Received: --colour"),
])
def test_bad_arguments_fail_with_a_message(args, expected):
    result = cluster_script(*args)
    assert result.returncode == 2 and expected in result.stderr, result.stderr


@pytest.fixture
def prefix():
    """A prefix for this test; the cluster is taken down afterwards whatever happened."""
    name, subnet = unique_prefix()
    yield name, subnet
    cluster_script("down", "--prefix", name)
    assert leftovers(name) == []


def _up(prefix: tuple[str, str], *args: str) -> subprocess.CompletedProcess:
    result = cluster_script("up", *args, "--prefix", prefix[0], "--subnet", prefix[1])
    if result.returncode == EXIT_NO_RIGHTS:
        pytest.skip(f"simulated hosts cannot be created here: {result.stderr.strip()}")
    return result


def _qdisc(device: str) -> str:
    return subprocess.run(["tc", "qdisc", "show", "dev", device], capture_output=True, text=True).stdout


def test_up_again_reshapes_and_a_different_count_is_refused(prefix):
    name = prefix[0]
    first = _up(prefix, "2", "--bandwidth", "100mbit", "--slots", "2,1")
    assert first.returncode == 0, first.stderr
    assert "mpirun -n 3 " in first.stdout and f"--machinefile {state_dir(name)}/machinefile" in first.stdout
    assert (state_dir(name) / "machinefile").read_text() == f"{name}h0 slots=2\n{name}h1 slots=1\n"
    assert "rate 100Mbit" in _qdisc(f"{name}v1")
    again = _up(prefix, "2", "--bandwidth", "1gbit")
    assert again.returncode == 0 and "rate 1Gbit" in _qdisc(f"{name}v2")
    assert leftovers(name) == sorted([f"{name}br", f"{name}h0", f"{name}h1", f"{name}v1", f"{name}v2"])
    other = _up(prefix, "3")
    assert other.returncode == 1 and "already up with 2 hosts. Received: up 3" in other.stderr


def test_down_removes_only_what_up_created(prefix):
    name = prefix[0]
    assert _up(prefix, "1").returncode == 0
    foreign = f"{name}x"  # shares the prefix, but up did not create it
    subprocess.run(["ip", "link", "add", foreign, "type", "bridge"], check=True)
    try:
        down = cluster_script("down", "--prefix", name)
        assert down.returncode == 0 and f"removed network namespace {name}h0" in down.stdout
        assert leftovers(name) == [foreign] and not state_dir(name).exists()
        assert "nothing to remove" in cluster_script("down", "--prefix", name).stdout
    finally:
        subprocess.run(["ip", "link", "del", foreign], check=False)


def test_delay_needs_netem_and_says_so(prefix):
    name = prefix[0]
    result = _up(prefix, "1", "--bandwidth", "100mbit", "--delay", "5ms")
    if result.returncode == 0:  # a kernel with netem: the delay sits above the rate limit
        assert "netem" in _qdisc(f"{name}v1") and "tbf" in _qdisc(f"{name}v1")
        return
    assert result.returncode == 1 and "does not have. Received: --delay=5ms" in result.stderr
    assert leftovers(name) == [] and not state_dir(name).exists()
