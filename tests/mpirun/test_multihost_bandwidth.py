"""A job across two simulated hosts whose links are shaped to 100 Mbit/s.

One rank per host, so every byte the job counts crosses a shaped link. A round's messages are
strictly sequential (order, "ready", broadcast, training, report, reduction: each waits for the
one before), so the round's communication time is at least its bytes divided by the rate. The
token bucket may pass up to ``burst_bytes`` (16 KiB) at once in each direction; TCP/IP and
Ethernet headers (at least 66 bytes per 1448-byte segment, 4.5 %) more than cover that, which is
why the plain bound ``bytes / rate`` holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from conftest import ROOT, run_mpi
from simulated_hosts import leftovers, simulated_hosts

from mpi_trainer.launch.mpirun import mpirun_command

RATE_BITS = 100_000_000


def _images(path, samples: int = 240):
    """A 28x28 set, so the zoo's LeNet has its full 484,714 parameters (1.85 MiB)."""
    rng = np.random.default_rng(0)
    prototypes = rng.integers(0, 256, size=(10, 28, 28))
    labels = rng.integers(0, 10, size=samples)
    images = np.clip(prototypes[labels] + rng.normal(0, 60, size=(samples, 28, 28)), 0, 255).astype(np.uint8)
    np.savez(path, x_train=images[:200], y_train=labels[:200], x_test=images[200:], y_test=labels[200:])
    return path


def test_logged_comm_time_respects_the_shaped_bandwidth(tmp_path):
    data = _images(tmp_path / "images.npz")
    with simulated_hosts(2, "--bandwidth", "100mbit") as hosts:
        assert hosts.settings["bandwidth"] == "100mbit"
        result = run_mpi(2, ["train", "configs/quickstart.toml", "--set", f"data.source='{data}'",
                             "--set", "model.name=lenet", "--set", "train.epochs=2",
                             "--set", "data.validation_size=0", "--set", "checkpoint.every=0"],
                         tmp_path / "run", timeout=120, mpirun_args=hosts.mpirun_args)
    assert leftovers(hosts.prefix) == []
    assert result.returncode == 0, result.output
    model_bytes = result.summary()["model_bytes"]
    assert model_bytes >= 1_000_000
    rows = result.rounds()
    assert len(rows) == 2
    for index, row in enumerate(rows):
        sent = int(row["bytes"])
        # The state to the worker before the first round; in every round the worker's state in and the
        # combined state back out, plus under 4 KiB of pickled control messages.
        copies = 3 if index == 0 else 2
        assert copies * model_bytes <= sent <= copies * model_bytes + 4096
        # the result goes out while the sum comes in: the busier direction carries all copies but that one
        assert float(row["comm_seconds"]) >= (copies - 1) * model_bytes * 8 / RATE_BITS, row


def test_hosts_are_removed_when_the_body_fails():
    prefix = None
    try:
        with simulated_hosts(2, "--bandwidth", "100mbit") as hosts:
            prefix = hosts.prefix
            assert leftovers(prefix), "the hosts should exist inside the block"
            raise RuntimeError("a failing test body")
    except RuntimeError:
        pass
    assert prefix is not None and leftovers(prefix) == []


def link_bytes(interface: str) -> int:
    """Bytes the interface has carried both ways so far."""
    statistics = Path("/sys/class/net") / interface / "statistics"
    return sum(int((statistics / name).read_text()) for name in ("rx_bytes", "tx_bytes"))


def test_two_workers_on_one_host_send_one_model_across_the_link_each_way():
    """Rank 0 on one host, workers 1 and 2 on the other: the workers' host sums its two buffers before the
    link and shares the broadcast after it, so a round's weights cross the link once each way. (MPI's Reduce
    and Bcast across the two hosts, with MPI_TRAINER_SHARED_MEMORY=0, carried 1.5 times as much: 145 MB
    against 97 MB for these three rounds.)"""
    job = [sys.executable, str(ROOT / "tests" / "mpirun" / "transport_job.py"), "rounds"]
    with simulated_hosts(2, "--slots", "1,2") as hosts:
        link = f"{hosts.prefix}v2"  # the workers' host's end of its link to the bridge
        before = link_bytes(link)
        proc = subprocess.run(mpirun_command(3, [], extra=hosts.mpirun_args, program=job), cwd=ROOT,
                              capture_output=True, text=True, timeout=180)
        crossed = link_bytes(link) - before
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["exact"]
    once_each_way = 2 * result["bytes"] * result["rounds"]
    # TCP/IP and Ethernet headers add about 5 %, the job's start-up and small messages well under 2 MB
    assert once_each_way <= crossed <= 1.1 * once_each_way + 2_000_000, (crossed, once_each_way)


def test_auto_takes_the_narrow_wire_across_a_slow_link_and_float32_on_one_node(tmp_path):
    """``aggregation.wire_dtype = "auto"`` times the links only where the ranks are on different nodes."""
    data = _images(tmp_path / "images.npz")
    args = ["train", "configs/quickstart.toml", "--set", f"data.source='{data}'", "--set", "model.name=lenet",
            "--set", "train.epochs=1", "--set", "data.validation_size=0", "--set", "checkpoint.every=0",
            "--set", "aggregation.wire_dtype=auto"]
    with simulated_hosts(2, "--bandwidth", "100mbit") as hosts:
        across = run_mpi(2, args, tmp_path / "across", timeout=120, mpirun_args=hosts.mpirun_args)
    assert across.returncode == 0, across.output
    assert "aggregation.wire_dtype = auto: float16 (the slowest link moves" in across.output
    alone = run_mpi(2, args, tmp_path / "alone", timeout=120)
    assert alone.returncode == 0, alone.output
    assert "aggregation.wire_dtype = auto: float32 (every rank is on one node" in alone.output
