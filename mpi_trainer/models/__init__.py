"""Models: building (:mod:`.build`), compile settings (:mod:`.compile_settings`), the description that
travels to workers (:mod:`.spec`) and evaluation with shardable metric state (:mod:`.metric_state`).

The scheduler builds the model once (zoo name or ``package.module:function``),
then broadcasts a :class:`ModelSpec`: architecture JSON plus compile settings.
Workers rebuild from the spec, so every rank trains the same graph.
"""

from mpi_trainer.models.build import build_model, check_input, check_output, rebuild_model
from mpi_trainer.models.compile_settings import (
    check_compile_names,
    compile_model,
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
from mpi_trainer.models.spec import ModelSpec

__all__ = [
    "ModelSpec", "build_model", "check_compile_names", "check_input", "check_output", "compile_model",
    "compile_settings", "configured_metrics", "evaluate_model", "flat_metric_state", "implied_loss",
    "make_optimizer", "metric_state", "metrics_from_flat", "metrics_from_state", "rebuild_model",
    "summed_metric_state",
]
