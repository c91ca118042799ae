"""``data.stream``: HDF5 and uncompressed .npz read in batches, blocks as row ranges, evaluation from disk."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from sklearn.datasets import load_digits

from mpi_trainer.config import config_from_dict
from mpi_trainer.data.adapters import ArrayAdapter, LazyRows
from mpi_trainer.data.adapters.arrays import CHUNK_BATCHES, StreamedShare
from mpi_trainer.data.adapters.files import label_facts, stream_dataset
from mpi_trainer.data.pipelines import pipeline_source
from mpi_trainer.errors import ConfigError, DataError


def digits_h5(path, layout: str = "split"):
    x, y = load_digits(return_X_y=True)
    images = (x * 255 / 16).astype(np.uint8).reshape(-1, 8, 8)
    with h5py.File(path, "w") as handle:
        if layout == "split":
            for name, value in (("x_train", images[:1500]), ("y_train", y[:1500]), ("x_test", images[1500:]),
                                ("y_test", y[1500:])):
                handle.create_dataset(name, data=value)
        else:
            handle.create_dataset("x", data=images)
            handle.create_dataset("y", data=y)
    return path


class SliceLog:
    """An array that records the rows each read asked for."""

    def __init__(self, values: np.ndarray) -> None:
        self.values, self.reads = values, []
        self.shape, self.dtype = values.shape, values.dtype

    def __getitem__(self, index):
        self.reads.append(index)
        return self.values[index]

    def __len__(self) -> int:
        return len(self.values)


def test_a_share_is_read_one_shuffled_chunk_at_a_time_and_covers_its_rows_once_an_epoch():
    rows = 10_000
    features = SliceLog(np.arange(rows, dtype=np.float32).reshape(rows, 1))
    labels = SliceLog(np.arange(rows) % 7)
    adapter = ArrayAdapter(features, labels, 0, rows, "ids", lambda y: y.astype(np.int32))
    share = StreamedShare(adapter, 3000, 9000, 32, seed=0)
    for _ in range(2):  # an epoch, then the next in another order
        features.reads.clear()
        batches = [share[index][0][:, 0] for index in range(len(share))]
        seen = np.concatenate(batches)
        assert len(batches) == 188 and np.array_equal(np.sort(seen), np.arange(3000, 9000))
        assert not np.array_equal(seen, np.arange(3000, 9000))  # shuffled
        largest = max(read.stop - read.start for read in features.reads)
        assert largest == CHUNK_BATCHES * 32 and len(features.reads) == 6  # six contiguous chunk reads
        share.on_epoch_end()
    in_order = StreamedShare(adapter, 3000, 9000, 32, seed=None)  # train.shuffle = false: the rows' order
    assert np.array_equal(np.concatenate([in_order[i][0][:, 0] for i in range(len(in_order))]), np.arange(3000, 9000))


def test_labels_are_scanned_in_slices():
    labels = SliceLog(np.arange(200_000) % 10)
    assert label_facts(labels, [(0, 200_000)], "big") == (10, True)
    assert max(read.stop - read.start for read in labels.reads) <= 65536


def test_stream_dataset_keeps_splits_on_disk_and_holds_out_the_tail(tmp_path):
    cfg = config_from_dict({"data": {"source": str(digits_h5(tmp_path / "d.h5", "single")), "stream": True,
                                     "test_size": 0.1}})
    dataset = stream_dataset(cfg.data)
    assert dataset.num_train == 1617 and len(dataset.y_test) == 180
    assert isinstance(dataset.x_test, LazyRows) and dataset.x_test[0:4].dtype == np.float32
    assert dataset.input_shape == (8, 8, 1) and dataset.num_outputs == 10
    assert dataset.train.block_bounds(2) == [(0, 809), (809, 1617)]


def test_a_compressed_npz_cannot_stream(tmp_path):
    path = tmp_path / "d.npz"
    np.savez_compressed(path, x=np.zeros((10, 3)), y=np.zeros(10, dtype=np.int64))
    cfg = config_from_dict({"data": {"source": str(path), "stream": True}})
    with pytest.raises(DataError, match=r"needs its arrays stored uncompressed. Received: data.source="):
        stream_dataset(cfg.data)


def test_stream_applies_to_files_read_in_batches_only():
    with pytest.raises(ConfigError, match=r"`data.stream` applies to data files ending in one of"):
        config_from_dict({"data": {"source": "digits", "stream": True}})


def test_a_streamed_file_refuses_scatter_naming_the_input(tmp_path):
    cfg = config_from_dict({"data": {"source": str(digits_h5(tmp_path / "d.h5")), "stream": True,
                                     "placement": "scatter"}})
    with pytest.raises(DataError, match=r"which a file read in batches \(data.stream\) does not allow"):
        pipeline_source(cfg, 2)


def test_a_test_label_the_training_rows_never_have_is_refused(tmp_path):
    path = tmp_path / "d.h5"
    with h5py.File(path, "w") as handle:
        for name, value in (("x_train", np.zeros((20, 4))), ("y_train", np.arange(20) % 3),
                            ("x_test", np.zeros((5, 4))), ("y_test", np.array([0, 1, 2, 3, 1]))):
            handle.create_dataset(name, data=value)
    cfg = config_from_dict({"data": {"source": str(path), "stream": True}})
    with pytest.raises(DataError, match=r"d.h5: test label 3 is out of range: the training split has classes 0..2"):
        stream_dataset(cfg.data)
