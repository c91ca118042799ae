"""data.stream = "auto": a block that would not fit in a rank's memory is streamed, decided alike on
every rank before training, logged, and shown by check."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_trainer.comm.local import LocalWorld
from mpi_trainer.config import load_config
from mpi_trainer.data import memory
from mpi_trainer.errors import AgreedInputError, ConfigError
from mpi_trainer.launch.stream_choice import resolve_stream


@pytest.fixture
def images(tmp_path):
    path = tmp_path / "images.npz"
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.integers(0, 255, (400, 8, 8), dtype=np.uint8), y=rng.integers(0, 10, 400))
    return path


def test_the_block_is_estimated_as_float32_from_the_headers(images):
    assert memory.block_bytes(str(images), 2) == 400 * 64 * 4 // 2  # uint8 grows four times when read whole


def test_a_compressed_npz_or_a_csv_is_not_a_candidate(tmp_path):
    np.savez_compressed(tmp_path / "c.npz", x=np.zeros((10, 2)), y=np.zeros(10))
    (tmp_path / "d.csv").write_text("a,b\n1,2\n")
    assert memory.block_bytes(str(tmp_path / "c.npz"), 2) is None
    assert memory.block_bytes(str(tmp_path / "d.csv"), 2) is None


@pytest.mark.parametrize("free, streams", [(10**9, False), (50_000, True)])
def test_auto_streams_when_the_block_would_not_fit(images, monkeypatch, free, streams):
    monkeypatch.setattr(memory, "available_bytes", lambda: free)
    decision = memory.decide(str(images), 2, 3)
    assert decision.stream is streams
    assert ("streamed from disk" if streams else "read whole") in decision.describe()


def resolved_on_every_rank(cfg, size: int = 3):
    world = LocalWorld(size)
    transports = world.transports()

    def role(rank):
        try:
            return resolve_stream(transports[rank], cfg).data.stream
        except AgreedInputError as exc:
            return exc

    return world.run({rank: (lambda rank=rank: role(rank)) for rank in range(size)}, timeout=60)


def test_every_rank_takes_the_same_choice(images, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 50_000)
    cfg = load_config({"data": {"source": str(images)}})
    assert cfg.data.stream == "auto"  # the default
    assert resolved_on_every_rank(cfg) == {0: True, 1: True, 2: True}


def test_what_streaming_cannot_give_is_refused_when_the_block_does_not_fit(images, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 50_000)
    cfg = load_config({"data": {"source": str(images), "increment": {"enabled": True}}})
    outcomes = resolved_on_every_rank(cfg)
    assert all(isinstance(outcome, AgreedInputError) for outcome in outcomes.values()), outcomes
    assert "would not fit in memory" in str(outcomes[0]) and "data.increment.enabled" in str(outcomes[0])


def test_true_false_and_auto_are_the_values(images):
    assert load_config({"data": {"source": str(images), "stream": True}}).data.stream is True
    assert load_config({"data": {"source": str(images), "stream": False}}).data.stream is False
    with pytest.raises(ConfigError, match="data.stream.*Received.*'sometimes'"):
        load_config({"data": {"source": str(images), "stream": "sometimes"}})
