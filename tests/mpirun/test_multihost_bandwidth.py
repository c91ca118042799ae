"""A job across two simulated hosts whose links are shaped to 100 Mbit/s.

One rank per host, so every byte the job counts crosses a shaped link. A round's messages are
strictly sequential (order, "ready", broadcast, training, report, reduction: each waits for the
one before), so the round's communication time is at least its bytes divided by the rate. The
token bucket may pass up to ``burst_bytes`` (16 KiB) at once in each direction; TCP/IP and
Ethernet headers (at least 66 bytes per 1448-byte segment, 4.5 %) more than cover that, which is
why the plain bound ``bytes / rate`` holds.
"""

from __future__ import annotations

import numpy as np
from conftest import run_mpi
from simulated_hosts import leftovers, simulated_hosts

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
    for row in rows:
        sent = int(row["bytes"])
        # Weights once to the worker and once back, plus under 4 KiB of pickled control messages.
        assert 2 * model_bytes <= sent <= 2 * model_bytes + 4096
        assert float(row["comm_seconds"]) >= sent * 8 / RATE_BITS, row


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
