"""``mpi_trainer check``: a config validated without MPI: its data read, its model built and dry-run, and
what the fit would refuse said here first."""

from __future__ import annotations

from mpi_trainer.config import Config
from mpi_trainer.errors import ConfigError


def check(cfg: Config, workers: int | None = None) -> str:
    """``mpi_trainer check``: validate without MPI (load the data, build the model); a one-line description."""
    import numpy as np

    from mpi_trainer.algorithms.early_stopping import watched_metric
    from mpi_trainer.algorithms.outer_optimizer import OuterSettings
    from mpi_trainer.data.augmentation import check_image_input
    from mpi_trainer.data.partition import block_bounds
    from mpi_trainer.data.pipelines import pipeline_source
    from mpi_trainer.data.sources import load_dataset
    from mpi_trainer.launch.devices import check_training_backend, configured_backend
    from mpi_trainer.launch.process_placement import backend_installed
    from mpi_trainer.launch.stream_choice import with_stream
    from mpi_trainer.models import build_model
    from mpi_trainer.models.dry_run import SAMPLES, dry_run

    check_training_backend(configured_backend(), backend_installed)
    from mpi_trainer.trainer.config_fit import APPLIED
    from mpi_trainer.trainer.settings import refusals

    refused = refusals(cfg, applied=APPLIED)  # what the fit would refuse, said here first
    if refused:
        raise ConfigError("\n".join(refused))
    stream_note = ""
    if cfg.data.stream_auto:
        from mpi_trainer.data.memory import decide

        decision = decide(cfg.data.source, workers or 1, 1 + (workers or 1))
        cfg, stream_note = with_stream(cfg, decision.stream), f"; {decision.describe()}" if cfg.data.is_file else ""
    dataset = pipeline_source(cfg, 1) or load_dataset(cfg.data, cfg.train.seed)
    check_image_input(cfg.data.augmentation, dataset.input_shape)
    model = build_model(cfg.model, dataset.input_shape, dataset.num_outputs, dataset.classes)
    if cfg.model.uses_lbfgs:
        from mpi_trainer.models.gradients import BlockGradient
        from mpi_trainer.trainer.state import ModelState

        BlockGradient(model, ModelState(model).trainable)  # the loss and backend it differentiates
    names = dry_run(model, *dataset.train.read(np.arange(min(SAMPLES, dataset.num_train))))
    watched_metric(cfg.early_stopping.monitor, cfg.early_stopping.patience, names, True)
    if workers is not None:
        try:
            block_bounds(dataset.num_train, workers)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    outer = OuterSettings.from_config(cfg, 2 if workers is None else workers).describe()
    if cfg.aggregation.outer_optimizer_auto:
        outer += ", chosen by aggregation.outer_optimizer = \"auto\"" + (" (none with one worker)"
                                                                         if workers is None else "")
    wire = ("; aggregation.wire_dtype = auto: float16 or float32, chosen at the job's start by timing each link"
            if cfg.aggregation.wire_dtype_auto else "")
    return (f"{dataset.describe()}; model {cfg.model.name} with {model.count_params()} parameters; {outer}"
            f"{stream_note}{wire}")
