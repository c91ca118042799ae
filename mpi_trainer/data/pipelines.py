"""The config's sources read as pipelines: an image folder (Keras' own ``image_dataset_from_directory``),
TFRecord files, or a file read in batches (``data.stream``). Each becomes a dataset whose training part
stays in its input (:mod:`.streamed`); what the config asks of it is checked first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mpi_trainer.config import Config
from mpi_trainer.data.streamed import check_allows, pipeline_dataset, streamed_train


def pipeline_source(cfg: Config, workers: int) -> Any:
    """The dataset of a source read as a pipeline (an image folder, TFRecords, a file read in batches), what
    the config asks of it checked first; None for a source read whole."""
    if cfg.data.stream is True:  # "auto" is resolved before (resolve_stream); unresolved, the file is read whole
        from mpi_trainer.data.adapters.files import stream_dataset

        dataset = stream_dataset(cfg.data)
        streamed = streamed_train(dataset)
        if streamed is not None:  # always: a file read in batches
            check_allows(cfg, streamed.adapter)
        return dataset
    if not (cfg.data.is_image_folder or cfg.data.is_tfrecord):
        return None
    from mpi_trainer.data.adapters.records import image_folder, tfrecords

    adapter, validation = (image_folder if cfg.data.is_image_folder else tfrecords)(cfg)
    check_allows(cfg, adapter)
    return pipeline_dataset(Path(cfg.data.source).name, adapter, validation, cfg, workers)
