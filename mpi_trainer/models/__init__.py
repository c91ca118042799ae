"""Models: building (:mod:`.build`), compile settings (:mod:`.compile_settings`) and scoring with a
metric state that sums over shards (:mod:`.metric_state`)."""

from mpi_trainer.models.build import build_model, check_input, check_output
from mpi_trainer.models.compile_settings import (
    check_compile_names,
    compile_settings,
    configured_metrics,
    implied_loss,
    make_optimizer,
)
from mpi_trainer.models.metric_state import (
    evaluate_model,
    flat_metric_state,
    metric_state,
    metrics_from_flat,
    metrics_from_state,
    summed_metric_state,
)

__all__ = [
    "build_model", "check_compile_names", "check_input", "check_output",
    "compile_settings", "configured_metrics", "evaluate_model", "flat_metric_state", "implied_loss",
    "make_optimizer", "metric_state", "metrics_from_flat", "metrics_from_state",
    "summed_metric_state",
]
