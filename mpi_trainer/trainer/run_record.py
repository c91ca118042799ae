"""The run directory of a ``fit`` on the user's model (rank 0 only): what it is, what it holds.

A directory is written only when the script names one (``run_dir=``, or ``launch``'s). It holds
``rounds.csv`` (one row per epoch, flushed each epoch), ``summary.json``, ``fit.json`` (what the
run is: the model, its compile settings, the data and the arguments, as a fingerprint),
``train.log`` and ``checkpoint.h5`` (the whole training state, checksummed, with a backup copy).

A directory that holds a run of *another* fit (any fingerprint entry differs) is refused before
training, naming what differs: its result is never returned for this one. The same fit finds
its run again: an unfinished one resumes from its last state, a complete one trains nothing
and hands back its result, as the command line's ``train`` does.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer.algorithms.outer_optimizer import STATE_PREFIX as OUTER_PREFIX
from mpi_trainer.errors import ConfigError
from mpi_trainer.logs import add_log_file, get_logger
from mpi_trainer.persistence.run_files import (
    CHECKPOINT_NAME,
    FIT_PRINT_NAME,
    LOG_NAME,
    ROUNDS_NAME,
    SUMMARY_NAME,
)

TIMELINE_EVERY_SECONDS = 10.0  # timeline.json rewritten at most this often while the fit trains
FIXED_COLUMNS = ["round", "wall_seconds", "train_seconds_max", "train_seconds_min", "comm_seconds",
                 "aggregate_seconds", "eval_seconds", "bytes", "test_loss", "test_accuracy", "max_staleness"]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _names(tree: Any, found: dict[str, int]) -> dict[str, int]:
    """Every ``name`` entry's value in ``tree``, numbered in order of first appearance."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key == "name" and isinstance(value, str):
                found.setdefault(value, len(found))
            else:
                _names(value, found)
    elif isinstance(tree, list):
        for value in tree:
            _names(value, found)
    return found


def _nameless(tree: Any, names: dict[str, int] | None = None) -> Any:
    """A config without its ``name`` entries, and the references to them (a functional model's
    ``keras_history``, its inputs and outputs) by their order: Keras numbers names per process
    (``dense_3``), so the same script's model is named differently in a second fit of one process."""
    names = _names(tree, {}) if names is None else names
    if isinstance(tree, dict):
        return {key: _nameless(value, names) for key, value in tree.items() if key != "name"}
    if isinstance(tree, list):
        return [_nameless(value, names) for value in tree]
    if isinstance(tree, str) and tree in names:
        return f"#{names[tree]}"
    return tree


def _model_text(model: Any) -> str:
    try:
        return json.dumps(_nameless(json.loads(model.to_json())), sort_keys=True)
    except Exception:  # noqa: BLE001 - a subclassed model without get_config: its class and weights describe it
        return f"{type(model).__qualname__}:{[(w.path, tuple(w.shape)) for w in model.weights]}"


def _compile_text(model: Any) -> str:
    try:
        compiled = model.get_compile_config()
    except Exception:  # noqa: BLE001 - compile arguments that do not serialise: their reprs then
        compiled = {"loss": repr(getattr(model, "loss", None))}
    optimizer = getattr(model, "optimizer", None)
    settings = optimizer.get_config() if optimizer is not None else None
    return json.dumps(_nameless([compiled, settings]), sort_keys=True, default=repr)


def data_print(data: Any) -> str:
    """Shapes, dtypes and a CRC of the first and last rows of every array (a pipeline: its kind)."""
    import keras

    parts = []
    for leaf in keras.tree.flatten(data):
        if leaf is None:
            continue
        if not hasattr(leaf, "shape"):
            parts.append(type(leaf).__name__)
            continue
        array = np.asarray(keras.ops.convert_to_numpy(leaf) if not isinstance(leaf, np.ndarray) else leaf)
        ends = np.concatenate([array[:64].reshape(-1), array[-64:].reshape(-1)]) if len(array) else array
        crc = zlib.crc32(ends.astype(str).tobytes() if ends.dtype.hasobject else ends.tobytes())
        parts.append(f"{array.shape}:{array.dtype}:{crc:08x}")
    return ";".join(parts)


# The config keys whose change makes a saved state or the data split meaningless.
COMPATIBILITY_KEYS = ("data.source", "data.test_size", "data.validation_size", "model.name", "model.optimizer",
                      "model.loss", "train.seed", "aggregation.ssp",
                      "aggregation.optimizer_state")


def _flatten_keys(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            flat.update(_flatten_keys(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def fingerprint(model: Any, data: Any, arguments: dict[str, Any], config: dict[str, Any]) -> dict[str, str]:
    """What makes a fit this fit; a directory's run is resumed only when every entry is equal.

    Not the epochs (a complete run asked for more goes on) nor the settings a run may change when it
    resumes (the workers, the logs, the checkpoints' cadence): of the config, the keys that
    :data:`COMPATIBILITY_KEYS` names."""
    flat = _flatten_keys(config)
    kept = {key: flat.get(key) for key in COMPATIBILITY_KEYS}
    return {"model": _digest(_model_text(model)), "compile": _digest(_compile_text(model)),
            "data": _digest(data_print(data)),
            "arguments": json.dumps({k: v for k, v in arguments.items() if k != "epochs"}, sort_keys=True,
                                    default=repr),
            "config": _digest(json.dumps(kept, sort_keys=True, default=repr))}


class FitRecord:
    """Rank 0's record of one fit: rows, summary, state checkpoints; a no-op without a directory."""

    def __init__(self, path: Path | None, print_: dict[str, str], describe: dict[str, Any], every: int = 0,
                 every_seconds: float = 0.0, config_text: str = "", tensorboard: bool = False,
                 plots: bool = False, timeline: bool = False) -> None:
        self.path, self.print_, self.describe = path, print_, describe
        self.config_text = config_text  # the whole config as applied, written as config.toml
        self.tensorboard, self.plots = tensorboard, plots  # log.tensorboard, log.plots: as the command line's
        self.board: Any = None  # the TensorBoard writer while the fit trains
        self.timeline: Any = None  # log.timeline: every rank's phases an epoch (a Timeline while the fit trains)
        self.timeline_wanted, self.timeline_written = timeline, time.monotonic()
        self.every, self.every_seconds = every, every_seconds  # checkpoint.every / every_seconds
        self.saved_at = time.time()
        self.rows: list[dict[str, Any]] = []
        self.stop_reason = "epochs"
        self.restored: int | None = None  # the epoch whose weights a callback restored at the end (EarlyStopping)
        self.complete = False  # the directory held this fit's complete run: nothing trains, its files stay
        self.started = time.time()
        self.elapsed_before = 0.0  # a resumed run: the wall seconds of its epochs before this job
        self.log = get_logger()
        self.traffic = 0
        self.lock: Any = None
        self.history: dict[str, list[float]] = {}
        self.epochs: list[int] = []
        self.header: list[str] = []  # rounds.csv's columns as written
        self.lost: list[dict[str, Any]] = []  # fault.survive: the workers lost, each {rank, host, where}
        self.divergence: dict[str, Any] | None = None  # train.divergence: the one confirmed {round, cause, action}
        self.resumed_after: int | None = None  # the last epoch of the checkpoint this job resumed from
        self.saved_seeds: list[list[np.ndarray]] = []  # a resumed run's workers' seed generators' states
        # What the run survived, over all its jobs (a resumed run's earlier ones too): rollbacks, checkpoints
        # passed over for their backup, lost workers, resumptions; each {"event", "round", ...}, in summary.json.
        self.survived: list[dict[str, Any]] = []

    # -- before training -----------------------------------------------------------
    def open(self) -> dict[str, Any] | None:
        """Lock the directory and read the run it holds: None (a new run), or its saved state."""
        if self.path is None:
            return None
        from mpi_trainer.persistence.run_lock import RunLock, launcher_holder

        self.lock = RunLock(self.path).acquire(launcher_holder())
        recorded = self.path / FIT_PRINT_NAME
        if not recorded.exists():
            if (self.path / CHECKPOINT_NAME).exists() or (self.path / SUMMARY_NAME).exists():
                self.lock.release()
                raise ConfigError(f"`run_dir` {str(self.path)!r} holds a run without a fingerprint (it has "
                                  f"{CHECKPOINT_NAME} or {SUMMARY_NAME} but no {FIT_PRINT_NAME}: another tool's, or "
                                  f"an earlier mpi_trainer's), which this fit cannot resume. Received: "
                                  f"run_dir={str(self.path)!r}; expected a new directory (or none), or the config "
                                  f"that run was started with")
            return None
        earlier = json.loads(recorded.read_text(encoding="utf-8"))
        differs = sorted(key for key in set(earlier) | set(self.print_) if earlier.get(key) != self.print_.get(key))
        if differs:
            self.lock.release()
            raise ConfigError(f"`run_dir` {str(self.path)!r} holds the run of another fit: its {', '.join(differs)} "
                              f"differ from this call's. Received: run_dir={str(self.path)!r}; expected a new "
                              f"directory (or none) for a different model, data, compile or arguments")
        saved = self._saved(self.path)
        if saved is None:
            self._started_over(self.path)
        return saved

    def _started_over(self, path: Path) -> None:
        """This fit's directory holds epochs of an earlier job but no checkpoint to resume them from (it was
        stopped before its first): the fit starts again at its first epoch from the model as given, and says so."""
        from mpi_trainer.persistence.run_files import read_rounds

        try:
            epochs = len(read_rounds(path / ROUNDS_NAME))
        except (OSError, ValueError):
            return
        if epochs:
            self.survived.append({"event": "started_over", "round": -1, "epochs_lost": epochs})
            self.log.warning("%s holds %d epoch(s) of an earlier job of this fit but no checkpoint (checkpoint.every "
                             "or every_seconds not reached before it stopped): this fit starts again at its first "
                             "epoch, from the model's weights as the script gives them", path, epochs)

    def _saved(self, path: Path) -> dict[str, Any] | None:
        """The checkpoint's state, or its backup's when the latest is missing, cut or damaged (a warning
        names it, and summary.json's ``survived`` lists it); None when the directory holds neither."""
        from mpi_trainer.persistence.checkpoint import load_checkpoint
        from mpi_trainer.persistence.run_files import backup_path

        latest = path / CHECKPOINT_NAME
        if not latest.exists() and not backup_path(latest).exists():
            return None
        passed_over: list[str] = []
        arrays, meta = load_checkpoint(latest, passed_over)
        self.survived = list(meta.get("survived", []))
        if passed_over:
            self.survived.append({"event": "checkpoint_backup", "round": meta["next_epoch"] - 1,
                                  "passed_over": passed_over})
        return {"state": arrays["state"], "integers": [arrays[f"integer_{i}"] for i in range(meta["integers"])],
                "next_epoch": meta["next_epoch"], "complete": meta["complete"], "history": meta["history"],
                "epochs": meta["epochs"], "rows": meta["rows"], "stop_reason": meta["stop_reason"],
                "outer": {name: array for name, array in arrays.items() if name.startswith(OUTER_PREFIX)},
                "seeds": seeds_from(arrays)}

    def begin(self, saved: dict[str, Any] | None) -> None:
        if self.path is None:
            return
        from mpi_trainer.persistence.run_files import CONFIG_NAME, write_atomic, write_json_atomic

        add_log_file(self.path / LOG_NAME)
        complete = saved is not None and saved["complete"]
        if not complete:  # a complete run's files stay as they are, untouched
            write_json_atomic(self.path / FIT_PRINT_NAME, self.print_)
            if self.config_text:
                write_atomic(self.path / CONFIG_NAME, self.config_text)
        if saved is not None:
            self.rows, self.history, self.epochs = saved["rows"], saved["history"], saved["epochs"]
            self.saved_seeds = saved["seeds"]  # each worker's seed generators, where the run left them
            self.elapsed_before = float(self.rows[-1].get("elapsed_seconds") or 0) if self.rows else 0.0
            self.complete = saved["complete"]
            if self.complete:  # an unfinished run goes on, whatever stopped it (a preemption) before
                self.stop_reason = saved["stop_reason"]
            self.traffic = sum(int(float(row.get("bytes") or 0)) for row in self.rows)  # each row: its epoch's
            if self.complete:
                self.log.info("the run in %s is complete (stop_reason %s after %d rounds); nothing to train. Ask "
                              "for more epochs to go on, or choose another run directory", self.path,
                              self.stop_reason, saved["next_epoch"])
            else:
                self.resumed_after = saved["next_epoch"] - 1
                self.survived.append({"event": "resumed", "round": self.resumed_after})
                self.log.info("%s holds an unfinished run: resuming after round %d (its last checkpoint)",
                              self.path, self.resumed_after)
        if not complete:
            self._rewrite_rows(self.path)
        if self.tensorboard and not self.complete:
            from mpi_trainer.reporting.tensorboard import TensorBoardRounds

            self.board = TensorBoardRounds(self.path, self.rows)  # a resumed run's epochs, then this job's
        if self.timeline_wanted and not self.complete:
            from mpi_trainer.persistence.run_files import TIMELINE_NAME
            from mpi_trainer.reporting.timeline import Timeline

            self.timeline = Timeline.load(self.path / TIMELINE_NAME, through_round=len(self.rows) - 1)
            for rank, placement in enumerate(self.describe.get("placement", [])):
                self.timeline.name_rank(rank, f"rank {rank} {placement.get('role', '')} ({placement.get('host', '')})")

    # -- each epoch ---------------------------------------------------------------
    def warn(self, message: str) -> None:
        self.log.warning("%s", message)

    def lost_worker(self, world_rank: int, host: str, where: str) -> None:
        """``fault.survive``: a worker was lost and the others carry on; named in the log and the summary."""
        self.lost.append({"rank": world_rank, "host": host, "where": where})
        self.survived.append({"event": "lost_worker", "round": len(self.rows), "rank": world_rank, "host": host})
        self.log.warning("%s: worker rank %d on host %s was lost", where, world_rank, host)

    def count_bytes(self, sent: int) -> None:
        """Traffic outside an epoch (the final state handed to the workers): in the run's total only."""
        self.traffic += sent

    def rolled_back(self, epoch: int, cause: str, rates: list[float]) -> None:
        """``train.nan_policy = "rollback"``: the epoch's round went non-finite and starts again from the state
        before it, the learning rates halved to ``rates``; kept for summary.json (``survived``)."""
        self.survived.append({"event": "nan_rollback", "round": epoch, "cause": cause, "learning_rates": rates})

    def stopped(self, reason: str) -> None:
        self.stop_reason = reason

    def restored_weights(self, epoch: int | None) -> None:
        """A callback ended the fit by restoring the weights of ``epoch`` (EarlyStopping's
        ``restore_best_weights``): summary.json's final figures are that epoch's, as the final model is."""
        if epoch is None or not self.rows or epoch == self.rows[-1]["round"]:
            return
        self.restored = epoch
        self.log.info("the fit ends with the weights of epoch %d, which EarlyStopping restored; summary.json's "
                      "final_* figures are that epoch's (kept_round)", epoch)

    def epoch(self, epoch: int, logs: dict[str, float], reports: list[Any], times: dict[str, float],
              state: Any = None) -> None:
        sent = int(times.pop("bytes", 0))
        staleness = times.pop("max_staleness", 0)  # SSP: the most an epoch's update started ahead of the slowest
        self.traffic += sent
        seconds = [report.seconds for report in reports]
        trained: dict[int, list[float]] = {}  # each worker's seconds and rows this epoch
        for index, report in enumerate(reports):
            spent = trained.setdefault(report.worker or index + 1, [0.0, 0])
            spent[0] += report.seconds
            spent[1] += report.rows
        row = {"round": epoch, **times, "train_seconds_max": max(seconds), "train_seconds_min": min(seconds),
               "worker_train_seconds": ";".join(f"{trained[w][0]:.4g}" for w in sorted(trained)),
               "block_sizes": ";".join(str(trained[w][1]) for w in sorted(trained)),
               "bytes": sent, "test_loss": logs.get("test_loss", logs.get("val_loss", math.nan)),
               "test_accuracy": logs.get("test_accuracy", logs.get("val_accuracy", logs.get("val_acc", math.nan))),
               "max_staleness": staleness, "elapsed_seconds": self.elapsed_before + time.time() - self.started,
               "train_loss": logs.get("loss", math.nan), "train_accuracy": logs.get("accuracy", math.nan),
               **{key: float(value) for key, value in logs.items()}}
        self.rows.append(row)
        self.log.debug("epoch %d: %s", epoch, ", ".join(f"{k} {v:.4g}" for k, v in sorted(logs.items())))
        if self.path is not None:
            self._append_row(self.path, row)
        if self.board is not None:
            self.board.write_round(row)

    def _columns(self) -> list[str]:
        extra = sorted({key for row in self.rows for key in row} - set(FIXED_COLUMNS))
        return FIXED_COLUMNS + extra

    def _append_row(self, path: Path, row: dict[str, Any]) -> None:
        if len(self.rows) == 1 or set(row) - set(self.header):
            self._rewrite_rows(path)  # a new column (a callback's log): the header grows, the rows are rewritten
            return
        with open(path / ROUNDS_NAME, "a", encoding="utf-8") as handle:
            handle.write(",".join(_cell(row.get(c, "")) for c in self.header) + "\n")
            handle.flush()

    def _rewrite_rows(self, path: Path) -> None:
        from mpi_trainer.persistence.run_files import write_atomic

        columns = self.header = self._columns()
        lines = [",".join(columns)] + [",".join(_cell(row.get(c, "")) for c in columns) for row in self.rows]
        write_atomic(path / ROUNDS_NAME, "\n".join(lines) + "\n")

    def checkpoint(self, next_epoch: int, state: Any, callbacks: Any, force: bool = False,
                   outer: dict[str, np.ndarray] | None = None) -> None:
        """Save the state after an epoch when ``checkpoint.every`` or ``every_seconds`` says so (or ``force``:
        a preemption); ``outer``: the outer optimizer's state arrays, saved beside it."""
        import keras

        due = force or (self.every and next_epoch % self.every == 0) or (
            self.every_seconds and time.time() - self.saved_at >= self.every_seconds)
        if self.path is None or not due:
            return
        history = next(c for c in callbacks.callbacks if isinstance(c, keras.callbacks.History))
        flat = state.read(state.empty())
        if any(isinstance(c, keras.callbacks.SwapEMAWeights) and getattr(c, "_ema_weights_in_model", False)
               for c in callbacks.callbacks):  # the EMA shown at the epoch's end: the next epoch trains on
            state.swap_ema(flat)  # the weights it swaps back in, so a resumed run does too
        self.save_state(flat, state.read_integers(), next_epoch, self.merged(history), False, outer)
        self.saved_at = time.time()

    def merged(self, history: Any) -> Any:
        """A resumed run's earlier epochs, then ``history``'s (this job's)."""
        import keras

        whole = keras.callbacks.History()
        whole.history = {key: list(values) for key, values in self.history.items()}
        for key, values in history.history.items():
            whole.history.setdefault(key, []).extend(values)
        whole.epoch = list(self.epochs) + list(history.epoch)
        return whole

    def save_state(self, state: np.ndarray, integers: list[np.ndarray], next_epoch: int, history: Any,
                   complete: bool, outer: dict[str, np.ndarray] | None = None) -> None:
        """The whole training state after an epoch (and the History so far, and the outer optimizer's
        ``outer_*`` arrays), checksummed."""
        if self.path is None:
            return
        from mpi_trainer.persistence.checkpoint import save_checkpoint

        arrays = {"state": state, **{f"integer_{i}": np.asarray(v) for i, v in enumerate(integers)}, **(outer or {})}
        meta = {"next_epoch": next_epoch, "round": next_epoch - 1, "complete": complete, "integers": len(integers),
                "history": {k: [float(x) for x in v] for k, v in history.history.items()},
                "epochs": list(history.epoch), "rows": self.rows, "stop_reason": self.stop_reason,
                "survived": self.survived}
        save_checkpoint(self.path / CHECKPOINT_NAME, arrays, json.loads(json.dumps(meta, default=float)))

    def save_weights(self, model: Any) -> None:
        """The kept model's Keras weights as ``final.weights.h5`` (checksummed). A model Keras will not save
        (a subclassed model that ``fit`` never calls stays unbuilt, and Keras refuses to save an unbuilt model)
        has its weights written as ``final.state.h5`` instead, in the checkpoints' codec: each weight by its
        path, checksummed; the log and summary.json (``final_weights``) say which file holds them."""
        if self.path is None:
            return
        from mpi_trainer.persistence.checkpoint import save_checkpoint
        from mpi_trainer.persistence.run_files import FINAL_STATE_NAME, FINAL_WEIGHTS_NAME, save_weights_atomic

        try:
            save_weights_atomic(model, self.path / FINAL_WEIGHTS_NAME)
            self.describe["final_weights"] = FINAL_WEIGHTS_NAME
            return
        except ValueError as exc:  # Keras' refusal of this model (unbuilt); anything else is a real failure
            refusal = str(exc)
        arrays = {f"weight_{index}": np.asarray(weight) for index, weight in enumerate(model.get_weights())}
        paths = [variable.path for variable in model.weights]
        save_checkpoint(self.path / FINAL_STATE_NAME, arrays, {"weights": paths, "keras_refused": refusal})
        self.describe["final_weights"] = FINAL_STATE_NAME
        self.log.warning("Keras would not save this model's weights (%s); its final weights are in %s instead, "
                         "each by its path (keras.Model.get_weights order)", refusal.splitlines()[0], FINAL_STATE_NAME)

    def finish(self, workers: int) -> dict[str, Any]:
        """The run's summary, written to summary.json; a complete run found again hands back the one it wrote."""
        kept = self._kept_summary()
        if kept is not None:
            return kept
        scored = [row["test_accuracy"] for row in self.rows if math.isfinite(row["test_accuracy"])]
        last = self.rows[-1] if self.rows else {}
        kept = next((row for row in self.rows if row["round"] == self.restored), None)  # the final model's epoch
        accuracy = _finite(kept.get("test_accuracy")) if kept else scored[-1] if scored else None
        summary = {"rounds_completed": len(self.rows), "final_round": last.get("round"),
                   "kept_round": (kept or last).get("round"),
                   "final_test_accuracy": accuracy,
                   "final_test_loss": _finite((kept or last).get("test_loss")),
                   "final_train_loss": _finite((kept or last).get("loss")),
                   "best_test_accuracy": max(scored) if scored else None,
                   "steps": sum(int(float(row.get("steps") or 0)) for row in self.rows),
                   "wall_seconds": time.time() - self.started, "traffic_bytes": self.traffic,
                   "resumed_after_round": self.resumed_after, "stop_reason": self.stop_reason, "workers": workers,
                   "completed": self.stop_reason != "preempted", **self.describe}
        summary["survived"] = self.survived
        summary["nan_rollbacks"] = sum(event["event"] == "nan_rollback" for event in self.survived)
        if self.lost:
            summary["lost_workers"] = self.lost
        if self.divergence:
            summary["divergence"] = self.divergence
        if self.path is not None:
            from mpi_trainer.persistence.run_files import write_json_atomic

            write_json_atomic(self.path / SUMMARY_NAME, summary)
        self.close_board()
        if self.timeline is not None and self.path is not None:
            from mpi_trainer.persistence.run_files import TIMELINE_NAME

            self.timeline.write(self.path / TIMELINE_NAME)
        if self.path is not None and self.plots and self.rows and self.stop_reason != "preempted":
            from mpi_trainer.reporting.report import write_report

            write_report(self.path)  # report.txt and the plots, as the command line's run ends
        return summary

    def phases(self, epoch: int, reports: list[Any], own: list[tuple[str, float, float]]) -> None:
        """log.timeline: the epoch's phases, each worker's as it reported them and rank 0's own; timeline.json
        rewritten at most every ten seconds, and at the end."""
        from mpi_trainer.persistence.run_files import TIMELINE_NAME

        if self.timeline is None or self.path is None:
            return
        for name, start, end in own:
            self.timeline.add(0, name, start, end, epoch)
        for rank, report in enumerate(reports):
            self.timeline.add_phases(report.worker or rank + 1, report.phases)
        if time.monotonic() - self.timeline_written > TIMELINE_EVERY_SECONDS:
            self.timeline.write(self.path / TIMELINE_NAME)
            self.timeline_written = time.monotonic()

    def close_board(self) -> None:
        if self.board is not None:
            self.board.close()
            self.board = None

    def _kept_summary(self) -> dict[str, Any] | None:
        if not self.complete or self.path is None:
            return None
        try:
            return dict(json.loads((self.path / SUMMARY_NAME).read_text(encoding="utf-8")))
        except (OSError, ValueError):  # lost or cut short: written again from the run's rows
            return None

    def columns(self) -> dict[str, list[float]]:
        """rounds.csv's numbers, a list per column (what ``History.rounds`` holds)."""
        names = [name for name in self._columns() if all(isinstance(row.get(name), (int, float)) for row in self.rows)]
        return {name: [float(row[name]) for row in self.rows] for name in names}

    def release(self) -> None:
        self.close_board()
        if self.lock is not None:
            self.lock.release()


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return str(value)


SEED_PREFIX = "seed_"  # the workers' seed generators' states in a checkpoint: seed_<worker>_<generator>


def seed_arrays(seeds: list[list[np.ndarray]]) -> dict[str, np.ndarray]:
    """Each worker's seed generators' states (by worker index) as the checkpoint's arrays."""
    return {f"{SEED_PREFIX}{worker}_{index}": np.asarray(value)
            for worker, values in enumerate(seeds) for index, value in enumerate(values)}


def seeds_from(arrays: dict[str, np.ndarray]) -> list[list[np.ndarray]]:
    """:func:`seed_arrays` read back: each worker's states, in order (none for a checkpoint without them)."""
    found: dict[int, dict[int, np.ndarray]] = {}
    for name, array in arrays.items():
        if name.startswith(SEED_PREFIX):
            worker, index = (int(part) for part in name[len(SEED_PREFIX):].split("_"))
            found.setdefault(worker, {})[index] = array
    return [[values[index] for index in sorted(values)] for _, values in sorted(found.items())]
