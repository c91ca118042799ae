"""The ``data`` section and its ``data.increment`` and ``data.augmentation`` tables."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from mpi_trainer.config.choices import (
    ARRAYS_SOURCE,
    BUILTIN_DATASETS,
    COLOR_MODES,
    DATA_SUFFIXES,
    FEATURE_DTYPES,
    FLIP_MODES,
    PIPELINE_SOURCE,
    PLACEMENTS,
    STREAM_SUFFIXES,
    TFRECORD_SUFFIXES,
    ColorMode,
    DataPlacement,
    FeatureDtype,
    FlipMode,
)
from mpi_trainer.config.section import Section
from mpi_trainer.errors import ConfigError


@dataclass
class IncrementConfig(Section):
    """Random data increment: each round a worker adds a seeded random draw to its fixed block."""

    prefix: ClassVar[str] = "data.increment"
    enabled: bool = False
    load_factor: float = 0.05
    absolute_factor: float = 0.8
    min_gap: int = 0

    def __post_init__(self) -> None:
        self._require(0 < self.load_factor <= 1, "load_factor", "must lie in (0, 1]")
        self._require(0 < self.absolute_factor <= 1, "absolute_factor", "must lie in (0, 1]")
        self._non_negative("min_gap")


@dataclass
class AugmentationConfig(Section):
    """Real-time image augmentation on workers, during training only."""

    prefix: ClassVar[str] = "data.augmentation"
    enabled: bool = False
    shift: float = 0.1
    rotation: float = 0.0
    zoom: float = 0.0
    flip: FlipMode = "none"

    def __post_init__(self) -> None:
        for name in ("shift", "rotation", "zoom"):
            self._fraction(name, low_open=False)
        self._choice("flip", FLIP_MODES)

    @property
    def flips(self) -> bool:
        """``flip`` is not ``"none"``: images are mirrored at random."""
        return self.flip != "none"


@dataclass
class DataConfig(Section):
    prefix: ClassVar[str] = "data"
    source: str = "digits"
    test_size: float = 0.2  # 0: nothing held out for testing (the test_* columns stay empty)
    # 0: no validation split unless best-of or a val_* monitor needs one (then DEFAULT_VALIDATION_SIZE)
    validation_size: float = 0.0
    placement: DataPlacement = "shared"
    label: str = ""
    features: list[str] = field(default_factory=list)
    datasets: list[str] = field(default_factory=list)
    rebalance: bool = False
    rebalance_smoothing: float = 0.5
    # read the training rows in batches from disk, blocks as row ranges (.h5 / .hdf5 / uncompressed .npz);
    # "auto": stream when a worker's block would not fit comfortably in its memory (data/memory.py)
    stream: bool | Literal["auto"] = "auto"
    # an image folder (data.source a directory, laid out as keras.utils.image_dataset_from_directory reads it)
    image_size: list[int] = field(default_factory=lambda: [256, 256])
    color_mode: ColorMode = "rgb"
    # TFRecords: data.features names the feature holding a sample, data.label its class index
    feature_shape: list[int] = field(default_factory=list)
    feature_dtype: FeatureDtype = "uint8"
    increment: IncrementConfig = field(default_factory=IncrementConfig)
    augmentation: AugmentationConfig = field(default_factory=AugmentationConfig)

    def __post_init__(self) -> None:
        self._fraction("test_size", low_open=False)  # 0: no test split (mpi_trainer.fit's default for arrays)
        self._fraction("validation_size", low_open=False)
        self._choice("placement", PLACEMENTS)
        self._require(len(self.datasets) in (0, 2, 4), "datasets",
                      "must list 4 array names (x_train, y_train, x_test, y_test) or 2 (x, y)")
        self._require(0 < self.rebalance_smoothing <= 1, "rebalance_smoothing",
                      "must lie in the interval (0, 1]")
        if self.is_image_folder or self.is_tfrecord:
            self._check_pipeline_source()
        elif self.is_file:
            path = Path(self.source).expanduser()
            self._require(
                path.suffix.lower() in DATA_SUFFIXES,
                "source",
                f"must be a built-in dataset {list(BUILTIN_DATASETS)} "
                f"or a file ending in one of {list(DATA_SUFFIXES)}",
            )
            # Under scatter only rank 0 reads the file (it checks it exists when it opens it).
            if not (path.is_file() or self.scatters):
                raise ConfigError(f"`data.source` names a data file that does not exist. Received: data.source="
                                  f"{self.source!r}; expected an existing file, {path.resolve()} (a relative path is "
                                  f"taken from the working directory, {Path.cwd()}), or a built-in dataset "
                                  f"{list(BUILTIN_DATASETS)}")
        elif self.source not in (ARRAYS_SOURCE, PIPELINE_SOURCE):
            self._choice("source", BUILTIN_DATASETS)
        for name in ("label", "features"):
            self._require(self.is_csv or self.is_tfrecord or not getattr(self, name), name,
                          "applies to .csv and TFRecord sources only")
        self._require(self.stream in (True, False, "auto"), "stream", "must be true, false or \"auto\"")
        self._require(self.stream is not True or (self.is_file and Path(self.source).suffix.lower() in STREAM_SUFFIXES),
                      "stream", f"applies to data files ending in one of {list(STREAM_SUFFIXES)}; the data.source "
                      f"{self.source!r} is read whole (or pass a pipeline to mpi_trainer.fit)")

    def _check_pipeline_source(self) -> None:
        """An image folder or TFRecords: read as a tf.data pipeline, which needs its shapes up front."""
        self._choice("color_mode", COLOR_MODES)
        self._require(len(self.image_size) == 2 and all(int(s) > 0 for s in self.image_size), "image_size",
                      "must be [height, width], both > 0")
        if self.is_tfrecord:
            self._require(len(self.features) == 1, "features", "must name the one TFRecord feature that holds "
                                                               "a sample, e.g. ['image']")
            self._require(bool(self.label), "label", "must name the TFRecord feature that holds the class index")
            self._require(len(self.feature_shape) > 0 and all(int(s) > 0 for s in self.feature_shape),
                          "feature_shape", "must give one sample's shape, e.g. [28, 28, 1]")
            self._choice("feature_dtype", FEATURE_DTYPES)

    @property
    def is_image_folder(self) -> bool:
        """``source`` is a directory of class sub-directories of images."""
        return self.source not in ("", ".") and Path(self.source).expanduser().is_dir()

    @property
    def is_tfrecord(self) -> bool:
        """``source`` is a TFRecord file or a glob of them (``data/train-*.tfrecord``)."""
        return Path(self.source).suffix.lower() in TFRECORD_SUFFIXES

    @property
    def uint8_features(self) -> bool:
        """``feature_dtype = "uint8"``: a TFRecord sample is stored as raw bytes, not float32 values."""
        return self.feature_dtype == "uint8"

    @property
    def stream_auto(self) -> bool:
        """``stream = "auto"``: the job streams when a worker's block would not fit comfortably in memory
        (decided at the job's start; ``stream`` is true or false from then on)."""
        return self.stream == "auto"

    @property
    def scatters(self) -> bool:
        """``placement = "scatter"``: rank 0 reads the data and sends each worker its rows."""
        return self.placement == "scatter"

    @property
    def is_file(self) -> bool:
        return "/" in self.source or Path(self.source).suffix != ""

    @property
    def is_csv(self) -> bool:
        return self.is_file and Path(self.source).suffix.lower() == ".csv"
