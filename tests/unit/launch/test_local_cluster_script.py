"""scripts/local_cluster.sh: argument errors, idempotent up, state-file teardown, netem detection.

These need no mpirun; the ones that create namespaces skip where the script reports missing rights.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest
from simulated_hosts import EXIT_NO_RIGHTS, STATE_ROOT, cluster_script, leftovers, state_dir, unique_prefix


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


def _root_only(path):
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    return path


def _refused(root, *args):
    """`up` and `down` under state root ``root``; both must refuse before touching the network."""
    env = {"MPT_CLUSTER_ROOT": str(root)}
    name, subnet = unique_prefix()
    up = cluster_script("up", "1", "--prefix", name, "--subnet", subnet, env=env)
    if up.returncode == EXIT_NO_RIGHTS:
        pytest.skip(f"needs root: {up.stderr.strip()}")
    down = cluster_script("down", "--prefix", name, env=env)
    assert leftovers(name) == []
    return up, down, name


def test_a_state_root_that_is_a_symbolic_link_or_open_to_others_is_refused(tmp_path):
    target = _root_only(tmp_path / "elsewhere")
    (tmp_path / "link").symlink_to(target)
    up, down, _ = _refused(tmp_path / "link")
    assert up.returncode == 1 and "is a symbolic link; expected a directory this script created" in up.stderr
    assert down.returncode == 1 and list(target.iterdir()) == []
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    up, _, _ = _refused(shared)
    assert up.returncode == 1 and "Received: owner uid 0, mode 777; expected root's, mode 700" in up.stderr


def test_a_state_directory_up_did_not_create_is_refused_and_never_written(tmp_path):
    """Someone else's directory named like the prefix's state (no mark, or not root's) is never used."""
    root = _root_only(tmp_path / "root")
    name, _ = unique_prefix()
    planted = _root_only(root / f"{name}.planted1")
    up, down, _ = _refused(root)
    assert up.returncode == 1 and "was not created by this script (it has no .created-by-local_cluster)" in up.stderr
    assert down.returncode == 1 and list(planted.iterdir()) == []  # no agent.sh written there
    os.chown(planted, 65534, 65534)
    (planted / ".created-by-local_cluster").touch()
    up, _, _ = _refused(root)
    assert up.returncode == 1 and "Received: owner uid 65534, mode 700" in up.stderr
    assert not (planted / "agent.sh").exists()


def test_up_keeps_its_state_in_a_fresh_private_directory_and_down_removes_it(prefix):
    name = prefix[0]
    result = _up(prefix, "1")
    assert result.returncode == 0, result.stderr
    state = state_dir(name)
    assert state.parent == STATE_ROOT and re.fullmatch(rf"{name}\.[A-Za-z0-9]{{8}}", state.name)
    assert f"state in {state}" in result.stdout
    info = state.stat()
    assert info.st_uid == 0 and stat.S_IMODE(info.st_mode) == 0o700
    assert stat.S_IMODE(STATE_ROOT.stat().st_mode) == 0o700
    (state / "planted").symlink_to("/etc/passwd")  # a link inside is refused, not followed
    again = _up(prefix, "1")
    assert again.returncode == 1 and "planted in the state directory is a symbolic link" in again.stderr
    (state / "planted").unlink()
    assert cluster_script("down", "--prefix", name).returncode == 0 and not state.exists()
