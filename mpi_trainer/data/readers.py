"""Raw arrays from every kind of source, with features left on disk where the format allows.

A reader returns :class:`RawArrays`: labels are always read in full (they are
small and every rank needs them to agree on the split), while features stay
lazy (an ``h5py`` dataset or a memory-mapped ``.npy`` member of an
uncompressed ``.npz``), so a worker that reads only its block's rows keeps
only those rows in memory.

Every member of an ``.npz`` is checked against the CRC-32 the zip format records
for it: a memory-mapped member when it is mapped (one pass over its bytes, a
chunk at a time), one read whole by zipfile as it is read. A damaged member
is refused naming the file, the member and both checksums.
"""

from __future__ import annotations

import csv
import threading
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.config import DataConfig
from mpi_trainer.errors import DataError

SPLIT_NAMES = ("x_train", "y_train", "x_test", "y_test")
SINGLE_NAMES = ("x", "y")
TABULAR_BUILTINS = {"iris": "load_iris", "wine": "load_wine", "breast_cancer": "load_breast_cancer"}


@dataclass
class RawArrays:
    """A source's arrays before splitting: ``x_test``/``y_test`` are None for the ``x, y`` layout."""

    x: Any
    y: np.ndarray
    x_test: Any = None
    y_test: np.ndarray | None = None
    tabular: bool = False
    class_names: list[str] | None = None
    keep_open: list[Any] = field(default_factory=list)  # file handles the lazy arrays need
    # Validation rows given apart from ``x`` (``mpi_trainer.fit``'s ``validation_data``); None: split from ``x``.
    x_val: Any = None
    y_val: np.ndarray | None = None
    sample_weight: np.ndarray | None = None  # one training weight per row of ``x`` (``fit``'s ``sample_weight``)
    input_layout: list[Any] | None = None  # dict inputs packed into ``x``: models.packed.Column per input
    target_layout: list[Any] | None = None  # targets per output packed into ``y``: data.targets.TargetColumn each


# Rows fetched per read: big enough for efficient HDF5 hyperslab reads, small enough that the
# temporary copy is negligible next to the block being assembled.
READ_CHUNK_ROWS = 4096


def read_rows(array: Any, rows: np.ndarray) -> np.ndarray:
    """``array[rows]`` for numpy, memmap and h5py arrays.

    Rows are fetched in increasing order (h5py requires it, and it is the fast
    way through a file) a chunk at a time, and written straight into the
    result, so reading a block costs the block plus one chunk of memory.
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), *array.shape[1:]), dtype=array.dtype)
    order = np.argsort(rows, kind="stable")
    ascending = rows[order]
    for start in range(0, len(rows), READ_CHUNK_ROWS):
        wanted = ascending[start:start + READ_CHUNK_ROWS]
        fetched = array[wanted] if isinstance(array, np.ndarray) else array[wanted.tolist()]
        out[order[start:start + READ_CHUNK_ROWS]] = fetched
    return out


def _names(wanted: list[str], available: set[str], path: Path, kind: str) -> tuple[str, ...]:
    if wanted:
        missing = [n for n in wanted if n not in available]
        if missing:
            raise DataError(f"`data.datasets` names arrays that {str(path)!r} does not hold: {missing}. "
                            f"Received: data.datasets={wanted}; the file holds {sorted(available)}")
        return tuple(wanted)
    for names in (SPLIT_NAMES, SINGLE_NAMES):
        if set(names) <= available:
            return names
    raise DataError(f"{str(path)!r} must hold {kind} {', '.join(SPLIT_NAMES)} or {', '.join(SINGLE_NAMES)} "
                    f"(or set data.datasets). Received: {sorted(available)}")


def _pack(arrays: list[Any], **extra: Any) -> RawArrays:
    if len(arrays) == 2:
        return RawArrays(arrays[0], np.asarray(arrays[1]), **extra)
    return RawArrays(arrays[0], np.asarray(arrays[1]), arrays[2], np.asarray(arrays[3]), **extra)


# -- .npz ---------------------------------------------------------------------
def _npz_member_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """Byte offset of a stored member's data: after its local header, name and extra field."""
    with path.open("rb") as handle:
        handle.seek(info.header_offset)
        header = handle.read(30)
        name_len = int.from_bytes(header[26:28], "little")
        extra_len = int.from_bytes(header[28:30], "little")
    return info.header_offset + 30 + name_len + extra_len


CRC_CHUNK = 1 << 22  # bytes read at a time to check a member's CRC-32


def check_member_crc(path: Path, info: zipfile.ZipInfo, offset: int) -> None:
    """Raise zipfile.BadZipFile unless the stored member at ``offset`` matches its recorded CRC-32."""
    crc, left = 0, info.compress_size
    with path.open("rb") as handle:
        handle.seek(offset)
        while left > 0:
            chunk = handle.read(min(CRC_CHUNK, left))
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            left -= len(chunk)
    if left or crc != info.CRC:
        raise zipfile.BadZipFile(f"member {info.filename!r} fails its CRC-32 check (the zip records "
                                 f"{info.CRC:08x}, its bytes give {crc:08x}): the file is damaged")


# NumPy reads a .npy header with ast.literal_eval, which CPython 3.11 cannot run in two threads at once
# ("AST constructor recursion depth mismatch"): ranks that are threads of one process (the in-process
# transport) read headers one at a time.
NPY_HEADERS = threading.RLock()


def read_npy_header(handle: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    """The shape, Fortran order and dtype of the ``.npy`` array whose magic string starts at ``handle``'s
    position; the handle is left at its data."""
    with NPY_HEADERS:
        version = np.lib.format.read_magic(handle)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        return read_header(handle)


def _npz_memmap(path: Path, info: zipfile.ZipInfo) -> np.ndarray | None:
    """Memory-map an uncompressed ``.npy`` member, once its CRC-32 checks out; None when it is compressed
    or holds objects (then it is read whole, and zipfile checks its CRC-32 as it reads)."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    offset = _npz_member_offset(path, info)
    check_member_crc(path, info, offset)
    with path.open("rb") as handle:
        handle.seek(offset)
        shape, fortran, dtype = read_npy_header(handle)
        data_offset = handle.tell()
    if dtype.hasobject or fortran or 0 in shape:
        return None
    return np.memmap(path, dtype=dtype, mode="r", shape=shape, offset=data_offset)


def read_npz(path: Path, datasets: list[str] | None = None) -> RawArrays:
    """Features of an uncompressed ``.npz`` are memory-mapped; compressed ones are read whole."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = {i.filename[:-4]: i for i in archive.infolist() if i.filename.endswith(".npy")}
        names = _names(datasets or [], set(members), path, "arrays")
        with NPY_HEADERS, np.load(path, allow_pickle=False) as loaded:  # a member read whole parses its header
            mapped = [_npz_memmap(path, members[n]) if i % 2 == 0 else None for i, n in enumerate(names)]
            arrays = [a if a is not None else loaded[n] for a, n in zip(mapped, names)]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"Cannot read {str(path)!r} as .npz: {exc}") from None
    return _pack(arrays)


# -- .h5 ------------------------------------------------------------------------
def read_h5(path: Path, cfg: DataConfig) -> RawArrays:
    import h5py

    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"Cannot open {str(path)!r} as HDF5: {exc}") from None
    available = {name for name, item in handle.items() if isinstance(item, h5py.Dataset)}
    try:
        names = _names(cfg.datasets, available, path, "datasets")
    except DataError:
        handle.close()
        raise
    arrays = [handle[n] if index % 2 == 0 else handle[n][()] for index, n in enumerate(names)]
    return _pack(arrays, keep_open=[handle])


# -- .csv -----------------------------------------------------------------------
def _csv_table(path: Path) -> tuple[list[str], list[list[str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.reader(handle) if row]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"Cannot read {str(path)!r} as CSV: {exc}") from None
    if len(rows) < 2:
        raise DataError(f"{str(path)!r} must hold a header row and at least one data row. "
                        f"Received {len(rows)} rows")
    header = [name.strip() for name in rows[0]]
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataError(f"{str(path)!r} line {number} has {len(row)} fields; "
                            f"the header has {len(header)}")
    return header, rows[1:]


def _csv_columns(cfg: DataConfig, header: list[str]) -> tuple[int, list[int]]:
    label = cfg.label or header[-1]
    if label not in header:
        raise DataError(f"`data.label` names a column the CSV file does not have. "
                        f"Received: data.label={label!r}; columns are {header}")
    features = cfg.features or [name for name in header if name != label]
    missing = [name for name in features if name not in header]
    if missing:
        raise DataError(f"`data.features` names columns the CSV file does not have: {missing}. "
                        f"Received: data.features={cfg.features}; columns are {header}")
    if label in features:
        raise DataError(f"`data.features` must not include the label column. Received: "
                        f"data.features={cfg.features}, data.label={label!r}")
    return header.index(label), [header.index(name) for name in features]


def _csv_float(text: str, column: str, line: int) -> float:
    text = text.strip()
    if text == "":
        return float("nan")  # reported by the NaN check with the split it lands in
    try:
        return float(text)
    except ValueError:
        raise DataError(f"CSV column {column!r} line {line}: features must be numbers. "
                        f"Received: {text!r}") from None


def csv_labels(values: list[str]) -> tuple[np.ndarray, list[str] | None]:
    """Integers are class indices and other numbers are targets, both as they are; any other text
    is mapped to classes in sorted order."""
    stripped = [v.strip() for v in values]
    for parse, dtype in ((int, np.int64), (float, np.float64)):
        try:
            return np.array([parse(v) for v in stripped], dtype=dtype), None
        except ValueError:
            pass
    names = sorted(set(stripped))
    index = {name: i for i, name in enumerate(names)}
    return np.array([index[v] for v in stripped], dtype=np.int64), names


def read_csv(path: Path, cfg: DataConfig) -> RawArrays:
    header, rows = _csv_table(path)
    label_col, feature_cols = _csv_columns(cfg, header)
    x = np.array([[_csv_float(row[c], header[c], line) for c in feature_cols]
                  for line, row in enumerate(rows, start=2)], dtype=np.float64)
    y, class_names = csv_labels([row[label_col] for row in rows])
    return RawArrays(x, y, tabular=True, class_names=class_names)


# -- built-ins ------------------------------------------------------------------
def read_sklearn(name: str) -> RawArrays:
    from sklearn import datasets

    if name == "digits":
        bunch = datasets.load_digits()
        return RawArrays(bunch.images.astype(np.float32) / 16.0, bunch.target)
    x, y = getattr(datasets, TABULAR_BUILTINS[name])(return_X_y=True)
    return RawArrays(x, y, tabular=True)


def read_file(cfg: DataConfig) -> RawArrays:
    path = Path(cfg.source).expanduser()
    if not path.is_file():
        raise DataError(f"`data.source` names a data file that does not exist. "
                        f"Received: data.source={cfg.source!r}; expected an existing file, {path.resolve()} "
                        f"(a relative path is taken from the working directory, {Path.cwd()})")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        return read_npz(path, cfg.datasets)
    if suffix == ".csv":
        return read_csv(path, cfg)
    return read_h5(path, cfg)
