"""Checksummed checkpoints and final weights: a damaged file that still parses is not trained from."""

from __future__ import annotations

import tracemalloc
import weakref

import h5py
import numpy as np
import pytest

from mpi_trainer.persistence.checkpoint import (
    StoredArray,
    StreamedArray,
    array_digest,
    load_checkpoint,
    open_checkpoint,
    save_checkpoint,
)
from mpi_trainer.persistence.run_files import (
    digest_path,
    file_sha256,
    save_weights_atomic,
    verify_digest,
    write_atomic,
)


def _two_checkpoints(path):
    save_checkpoint(path, {"weights": np.full(64, 1.0, np.float32),
                           "optimizer_rank_1": np.arange(8, dtype=np.float32)}, {"round": 1})
    save_checkpoint(path, {"weights": np.full(64, 2.0, np.float32),
                           "optimizer_rank_1": np.arange(8, dtype=np.float32) + 1}, {"round": 2})


def _flip_a_bit(path, dataset, byte=5):
    with h5py.File(path, "r") as handle:
        offset = handle[dataset].id.get_offset()
    raw = bytearray(path.read_bytes())
    raw[offset + byte] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("dataset", ["weights", "optimizer_rank_1"])
def test_a_flipped_bit_in_the_latest_checkpoint_falls_back_to_the_backup_naming_the_file(tmp_path, caplog,
                                                                                      dataset):
    path = tmp_path / "checkpoint.h5"
    _two_checkpoints(path)
    _flip_a_bit(path, dataset)
    with h5py.File(path, "r") as handle:
        handle[dataset][()]  # it still parses
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 1 and arrays["weights"].tolist() == [1.0] * 64
    assert f"checkpoint {path} is damaged" in caplog.text and "SHA-256" in caplog.text


@pytest.mark.parametrize("damaged", [False, True])
def test_a_state_left_on_disk_is_checked_as_the_file_is_opened_and_read_back_part_by_part(tmp_path, caplog,
                                                                                         monkeypatch, damaged):
    monkeypatch.setattr("mpi_trainer.persistence.checkpoint.READ_PART_BYTES", 1 << 20)
    path, state = tmp_path / "checkpoint.h5", np.arange(3 << 20, dtype=np.float32)  # 12 MB
    save_checkpoint(path, {"weights": np.ones(64, np.float32), "optimizer_rank_1": state - 1}, {"round": 1})
    save_checkpoint(path, {"weights": np.ones(64, np.float32), "optimizer_rank_1": state}, {"round": 2})
    if damaged:
        _flip_a_bit(path, "optimizer_rank_1", byte=8 << 20)  # in the eighth part
    tracemalloc.start()
    try:
        arrays, stored, meta = open_checkpoint(path, lambda name: name.startswith("optimizer_rank_"))
        opened = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert opened < state.nbytes / 4  # checked part by part, not read whole
    assert meta["round"] == (1 if damaged else 2) and set(arrays) == {"weights"}
    assert ("damaged" in caplog.text) == damaged
    left = stored["optimizer_rank_1"]
    assert isinstance(left, StoredArray) and (left.size, left.dtype) == (state.size, np.float32)
    parts = list(left.parts())
    assert [part.nbytes for part in parts] == [1 << 20] * 12
    np.testing.assert_array_equal(np.concatenate(parts), state - 1 if damaged else state)
    save_checkpoint(path, {"weights": np.zeros(64, np.float32)}, {"round": 3})  # a newer file replaces it
    np.testing.assert_array_equal(left.read(), state - 1 if damaged else state)  # read from the file opened


def test_garbage_of_the_same_shape_is_noticed(tmp_path, caplog):
    path = tmp_path / "checkpoint.h5"
    _two_checkpoints(path)
    with h5py.File(path, "r+") as handle:
        handle["weights"][...] = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 1 and "damaged" in caplog.text


def test_changed_metadata_is_noticed(tmp_path):
    path = tmp_path / "checkpoint.h5"
    _two_checkpoints(path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["meta"] = handle.attrs["meta"].replace('"round": 2', '"round": 7')
    assert load_checkpoint(path)[1]["round"] == 1


def test_both_damaged_fails_naming_both(tmp_path):
    path = tmp_path / "checkpoint.h5"
    _two_checkpoints(path)
    _flip_a_bit(path, "weights")
    _flip_a_bit(path.with_name("checkpoint.h5.bak"), "weights")
    with pytest.raises(FileNotFoundError, match=r"checkpoint\.h5: .*SHA-256.*checkpoint\.h5\.bak: .*SHA-256"):
        load_checkpoint(path)


def test_arrays_handed_over_one_at_a_time_are_written_as_they_come_and_a_failure_keeps_the_last_file(tmp_path):
    path, handed, held = tmp_path / "checkpoint.h5", [], []

    def states():  # as the scheduler gathers the workers' optimizer states, one after another
        yield "weights", np.zeros(10, np.float32)
        for rank in (1, 2, 3):
            held.append(sum(ref() is not None for ref in handed))  # earlier states still in memory
            state = np.full(1000, rank, np.float32)
            handed.append(weakref.ref(state))
            yield f"optimizer_rank_{rank}", state
            del state

    save_checkpoint(path, states(), {"round": 0})
    assert held == [0, 0, 0]  # each state was let go once written
    arrays, meta = load_checkpoint(path)
    assert sorted(arrays) == ["optimizer_rank_1", "optimizer_rank_2", "optimizer_rank_3", "weights"]
    assert arrays["optimizer_rank_3"].tolist() == [3.0] * 1000 and meta == {"round": 0}

    def lost():
        yield "weights", np.ones(10, np.float32)
        raise RuntimeError("worker rank 2 was lost")

    with pytest.raises(RuntimeError, match="was lost"):
        save_checkpoint(path, lost(), {"round": 1})
    assert not path.with_name("checkpoint.h5.tmp").exists()
    assert load_checkpoint(path)[1] == {"round": 0}  # the last whole checkpoint is untouched


def test_an_array_that_arrives_in_parts_is_written_as_they_come_with_the_whole_arrays_digest(tmp_path):
    state, path = np.arange(10_000, dtype=np.float32), tmp_path / "checkpoint.h5"
    streamed = StreamedArray(state.size, state.dtype, lambda take: [take(part.copy()) for part in
                                                                    np.array_split(state, 7)])
    save_checkpoint(path, {"weights": np.zeros(3, np.float32), "optimizer_rank_1": streamed}, {"round": 2})
    arrays, _ = load_checkpoint(path)
    np.testing.assert_array_equal(arrays["optimizer_rank_1"], state)
    with h5py.File(path, "r") as handle:
        assert handle["optimizer_rank_1"].attrs["sha256"] == array_digest("optimizer_rank_1", state)
    short = StreamedArray(state.size, state.dtype, lambda take: take(state[:10]))
    with pytest.raises(ValueError, match="of 10000 values was handed 10"):
        save_checkpoint(path, {"optimizer_rank_1": short}, {"round": 3})
    assert load_checkpoint(path)[1] == {"round": 2}  # the whole checkpoint stays


def test_a_checkpoint_of_the_previous_format_is_read_and_checked(tmp_path, caplog):
    import hashlib
    import json

    path, meta = tmp_path / "checkpoint.h5", json.dumps({"round": 3})
    weights = np.arange(5, dtype=np.float32)
    digest = hashlib.sha256(f"weights\0{weights.dtype.str}\0{weights.shape}\0".encode())
    digest.update(weights.tobytes())
    digest.update(meta.encode())
    with h5py.File(path, "w") as handle:  # format 2: one digest over every array, none per dataset
        handle.create_dataset("weights", data=weights)
        handle.attrs.update({"meta": meta, "format_version": 2, "sha256": digest.hexdigest()})
    arrays, loaded = load_checkpoint(path)
    assert loaded == {"round": 3} and arrays["weights"].tolist() == weights.tolist()
    with h5py.File(path, "r+") as handle:
        handle["weights"][0] = 9.0
    with pytest.raises(FileNotFoundError, match="SHA-256"):
        load_checkpoint(path)


class _Model:
    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def save_weights(self, path):
        with open(path, "wb") as handle:
            handle.write(self.payload)


def test_final_weights_record_their_digest_and_a_damaged_copy_is_refused(tmp_path):
    path = tmp_path / "final.weights.h5"
    save_weights_atomic(_Model(b"weights" * 100), path)
    assert digest_path(path).read_text() == f"{file_sha256(path)}  final.weights.h5\n"
    verify_digest(path)
    raw = bytearray(path.read_bytes())
    raw[10] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="final.weights.h5 is damaged"):
        verify_digest(path)


def test_no_file_is_written_through_a_planted_link(tmp_path):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json.tmp").symlink_to(target)
    write_atomic(run_dir / "summary.json", "{}")
    assert target.read_text() == "keep me" and (run_dir / "summary.json").read_text() == "{}"
    assert not (run_dir / "summary.json").is_symlink()
