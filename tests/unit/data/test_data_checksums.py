"""A data file whose format carries checksums is verified on read: a damaged one that parses is refused."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from mpi_trainer.config import DataConfig
from mpi_trainer.data.adapters.files import stream_dataset
from mpi_trainer.data.sources import load_dataset
from mpi_trainer.errors import DataError


def _npz(tmp_path, compressed=False):
    path = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    save = np.savez_compressed if compressed else np.savez
    save(path, x_train=rng.random((200, 8), dtype=np.float32), y_train=rng.integers(0, 3, 200),
         x_test=rng.random((40, 8), dtype=np.float32), y_test=rng.integers(0, 3, 40))
    return path


def _flip_in_member(path, member, at=-7):
    """Flip one bit inside a member's data (near its end: past the .npy header, so it still parses)."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(member)
    raw = bytearray(path.read_bytes())
    with path.open("rb") as handle:
        handle.seek(info.header_offset + 26)
        head = handle.read(4)
    start = info.header_offset + 30 + int.from_bytes(head[:2], "little") + int.from_bytes(head[2:], "little")
    raw[start + info.compress_size + at] ^= 0x04
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("member", ["x_train.npy", "x_test.npy", "y_train.npy"])
def test_a_flipped_bit_in_a_stored_member_is_refused_naming_it(tmp_path, member):
    path = _npz(tmp_path)
    load_dataset(DataConfig(source=str(path)), seed=0)  # intact: loads
    _flip_in_member(path, member)
    with pytest.raises(DataError, match=rf"Cannot read .*data.npz.*(CRC-32.*{member}|{member}.*CRC-32)"):
        load_dataset(DataConfig(source=str(path)), seed=0)


def test_a_flipped_bit_is_refused_when_streaming_too(tmp_path):
    path = _npz(tmp_path)
    _flip_in_member(path, "x_train.npy")
    with pytest.raises(DataError, match="x_train.npy' fails its CRC-32 check"):
        stream_dataset(DataConfig(source=str(path), stream=True))


def test_a_flipped_bit_in_a_compressed_file_is_refused(tmp_path):
    path = _npz(tmp_path, compressed=True)
    _flip_in_member(path, "x_train.npy", at=-3)
    with pytest.raises(DataError, match="Cannot read"):
        load_dataset(DataConfig(source=str(path)), seed=0)
