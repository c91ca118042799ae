"""Which outer step a fit of the user's model takes when ``aggregation.outer_optimizer = "auto"``.

An outer optimizer (Nesterov by default) steps the trainable weights from the workers' average as
if the round's change were a gradient. That speeds up a model trained by Keras' own ``train_step``
with one optimizer: its change is a descent direction of one loss. A model that trains with its
own ``train_step`` or steps several optimizers (a GAN's generator and discriminator, a
teacher and a student) makes changes that are not one loss's descent: a momentum step on them
amplifies whichever player moved most, and can leave the model worse than plain averaging (a
keras.io GAN ended farther from the data than an untrained generator). ``auto`` takes plain
averaging there. So it does for a model with BatchNormalization: its moving statistics are
combined for the workers' weights, and a step that moves the weights past their average leaves
the statistics measured for other weights (two BatchNorm CNNs ended 0.3 and 1.4 to 1.9 points
lower with the step than without, docs/outer-optimizer.md). The choice and its reason go into the run's log;
a value set by the user is used as it is.
"""

from __future__ import annotations

from typing import Any


def own_train_step(model: Any) -> bool:
    """Whether the model's class (or a class between it and Keras) defines its own ``train_step``."""
    for klass in type(model).__mro__:
        if "train_step" in vars(klass):
            return not klass.__module__.startswith("keras.")
    return False


def stepping_optimizers(model: Any) -> list[Any]:
    """The optimizers the model may step: ``model.optimizer`` (unless a custom ``train_step`` leaves it
    unused: Keras compiles a default one) and the optimizers the model and its layers hold."""
    from mpi_trainer.trainer.state import model_optimizers

    found = model_optimizers(model)
    compiled = getattr(model, "optimizer", None)
    if own_train_step(model) and compiled is not None and len(found) > 1:
        found = [optimizer for optimizer in found if optimizer is not compiled]
    return found


def choose_outer(requested: str, auto: bool, model: Any) -> tuple[str, str]:
    """The outer optimizer in effect and why: ``requested`` is the config's choice for the job's
    workers (``auto`` already resolved as for any model), ``auto`` whether the user left it to us."""
    if not auto:
        return requested, "set by aggregation.outer_optimizer"
    if requested == "none":
        return requested, "aggregation.outer_optimizer = \"auto\": nothing to step from with one worker"
    optimizers = stepping_optimizers(model)
    if len(optimizers) > 1:
        names = ", ".join(type(optimizer).__name__ for optimizer in optimizers)
        return "none", (f"aggregation.outer_optimizer = \"auto\": the model steps {len(optimizers)} optimizers "
                        f"({names}), so a round's change is not one loss's descent; plain averaging")
    from mpi_trainer.trainer.state import batchnorm_layers

    normalized = [layer.name for layer in batchnorm_layers(model)]
    if normalized:
        return "none", (f"aggregation.outer_optimizer = \"auto\": the model keeps moving statistics "
                        f"({', '.join(normalized)}), measured for the workers' average weights, which a step "
                        f"would move away from; plain averaging")
    if own_train_step(model):
        return "none", (f"aggregation.outer_optimizer = \"auto\": the model trains with its own train_step "
                        f"({type(model).__qualname__}), whose change need not be one loss's descent; "
                        f"plain averaging")
    return requested, ("aggregation.outer_optimizer = \"auto\": Keras' own train_step with one optimizer; "
                       "set aggregation.outer_optimizer = \"none\" for plain averaging")
