"""What :func:`mpi_trainer.fit` returns on every rank: rank 0's History, run figures and final weights.

Rank 0 gathers them from its engine (or from a complete run read back); one object broadcast hands
them to every rank, whose model (the user's, or the rank's own copy) then takes the final weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def history_everywhere(transport: Any, model: Any, finished: Any) -> Any:
    """Rank 0's History, run figures and final weights, handed to every rank; the user's model (or the
    rank's own copy of it) takes the weights. Returns this rank's ``keras.callbacks.History``."""
    import keras

    outcome = _outcome(finished) if transport.rank == 0 else None
    outcome = transport.bcast_object(outcome)
    target = model if isinstance(model, keras.Model) else _rank_model(finished)
    _prepare(target, outcome)
    _share_weights(transport, _rank_model(finished) if transport.rank == 0 else None, target, outcome["weights"])
    history = keras.callbacks.History()
    history.history, history.epoch = outcome["history"], outcome["epoch"]
    history.set_model(target)
    history.run_dir = None if outcome["run_dir"] is None else Path(outcome["run_dir"])
    history.summary, history.rounds = outcome["summary"], outcome["rounds"]
    return history


def _outcome(finished: Any) -> dict[str, Any]:
    """On rank 0: what every rank's History and model are made of."""
    from mpi_trainer.scheduler.callbacks import keras_logs

    engine, summary = finished
    model = engine.model
    rounds = engine.rounds
    numeric = [key for key in (rounds[0] if rounds else {}) if _is_number(rounds[0][key])]
    recorder = getattr(engine, "recorder", None)
    callbacks = getattr(recorder, "callbacks", None)
    if callbacks is not None:
        history, epoch = callbacks.history.history, callbacks.history.epoch
    else:  # L-BFGS iterations: their rows under Keras' names
        names = summary.get("metrics") or ["loss"]
        history, epoch = {}, []
        for row in rounds:
            epoch.append(int(row["round"]))
            for key, value in keras_logs(row, names).items():
                history.setdefault(key, []).append(value)
    return {"history": {k: [float(v) for v in values] for k, values in history.items()}, "epoch": list(epoch),
            "rounds": {key: [float(row[key]) for row in rounds] for key in numeric},
            "summary": summary, "run_dir": str(engine.run_dir),
            # each weight's shape and dtype: the values follow as raw arrays (_share_weights), not pickled
            "weights": [(tuple(v.shape), np.dtype(str(v.dtype)).str) for v in model.weights],
            # a complete run read back (nothing trained) has neither plan nor dataset
            "spec": getattr(getattr(engine, "plan", None), "model", None),
            "input_shape": tuple(getattr(getattr(engine, "dataset", None), "input_shape", None)
                                 or model.input_shape[1:])}


def _rank_model(finished: Any) -> Any:
    """The model this rank trained or scheduled with: rank 0's global model, a worker's local one."""
    if finished is None:
        return None
    if isinstance(finished, tuple):
        return finished[0].model
    return getattr(finished, "model", None)


def _prepare(model: Any, outcome: dict[str, Any]) -> None:
    """Build (an unbuilt model) and compile it (as the job did, unless the script compiled it)."""
    from mpi_trainer.models import compile_model

    if model is None:
        return
    if not model.built:
        model.build((None, *outcome["input_shape"]))
    spec = outcome["spec"]
    if getattr(model, "optimizer", None) is None and spec is not None and spec.optimizer is not None:
        compile_model(model, spec)


def _share_weights(transport: Any, source: Any, target: Any, specs: list[tuple[tuple[int, ...], str]]) -> None:
    """Rank 0's final weights (``source``'s) into every rank's ``target``, one array at a time: no rank holds
    a second copy of the whole model, pickled or not. Every rank takes part in every broadcast."""
    if target is not None and len(target.weights) != len(specs):
        raise ValueError(f"the model holds {len(target.weights)} weight arrays, the job's final weights "
                         f"{len(specs)}")
    for index, (shape, dtype) in enumerate(specs):
        values = (np.ascontiguousarray(source.weights[index].numpy()) if source is not None
                  else np.empty(shape, np.dtype(dtype)))
        transport.broadcast(values)
        if target is not None and target is not source:
            target.weights[index].assign(values)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool)
