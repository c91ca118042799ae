"""Fault tolerance without MPI: config keys, resume state, atomic checkpoints, NaN guard, step budgets."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mpi_trainer.algorithms import nan_guard
from mpi_trainer.algorithms.step_budget import step_budgets, steps_per_round
from mpi_trainer.cli import main
from mpi_trainer.config import Config, load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.persistence.checkpoint import load_checkpoint, save_checkpoint
from mpi_trainer.persistence.resume import check_weight_count, incompatible_keys, load_resume_state, trim_rounds
from mpi_trainer.persistence.run_files import RoundLog, read_rounds

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("override, message", [
    ("train.nan_policy=ignore", "`train.nan_policy` must be one of ['stop', 'rollback']. "
                                "Received: train.nan_policy='ignore'"),
    ("train.max_steps=-1", "`train.max_steps` must be >= 0. Received: train.max_steps=-1"),
    ("watchdog.worker_timeout=-5", "`watchdog.worker_timeout` must be >= 0. "
                                   "Received: watchdog.worker_timeout=-5.0"),
    ("watchdog.stall_seconds=-1", "`watchdog.stall_seconds` must be >= 0. "
                                  "Received: watchdog.stall_seconds=-1.0"),
    ("debug.nan_rank=-2", "`debug.nan_rank` must be >= 0. Received: debug.nan_rank=-2"),
])
def test_bad_fault_tolerance_keys_are_refused_with_key_and_value(override, message, capsys):
    with pytest.raises(ConfigError) as error:
        load_config(None, [override])
    assert message in str(error.value)
    assert main(["check", "configs/quickstart.toml", "--set", override]) == 2
    assert message in capsys.readouterr().err


def test_incompatible_resume_names_the_differing_keys():
    saved = Config().to_dict()
    changed = load_config(None, ["model.name=cnn", "data.source=iris", "train.epochs=99",
                                 "model.learning_rate=0.5"]).to_dict()
    assert incompatible_keys(saved, changed) == ["data.source", "model.name"]
    assert incompatible_keys(saved, Config().to_dict()) == []


def _round_rows(path: Path, rounds: range) -> None:
    log = RoundLog(path, ["round", "test_accuracy", "winner"])
    for index in rounds:
        log.write({"round": index, "test_accuracy": 0.5 + index / 100, "winner": ""})
    log.close()


def test_trim_rounds_drops_rows_after_the_checkpoint_and_appending_keeps_one_header(tmp_path):
    path = tmp_path / "rounds.csv"
    _round_rows(path, range(6))
    kept = trim_rounds(path, 3)
    assert [row["round"] for row in kept] == [0, 1, 2, 3]
    assert kept[2]["test_accuracy"] == pytest.approx(0.52)
    _round_rows(path, range(4, 6))
    assert [int(r["round"]) for r in read_rounds(path)] == [0, 1, 2, 3, 4, 5]
    assert path.read_text().count("round,") == 1


def test_trim_rounds_drops_a_row_torn_by_a_crash(tmp_path):
    path = tmp_path / "rounds.csv"
    _round_rows(path, range(3))
    with path.open("a") as handle:
        handle.write("1")  # round 12's row, cut off after its first digit
    assert [row["round"] for row in trim_rounds(path, 11)] == [0, 1, 2]
    assert [int(r["round"]) for r in read_rounds(path)] == [0, 1, 2]


def _save_run_checkpoint(run_dir: Path, round_index: int, config: dict, weights: np.ndarray) -> None:
    meta = {"round": round_index, "best_value": 0.9, "best_round": round_index, "wait": 1, "steps": 40,
            "lr_scale": 0.5, "wall_seconds": 12.5, "traffic_bytes": 1000, "config": config,
            "block_bounds": [[0, 5], [5, 10], [10, 15]], "rollbacks": [{"round": 1}]}
    arrays = {"weights": weights, "best_weights": weights * 2, "optimizer_rank_1": np.ones(3, np.float32)}
    save_checkpoint(run_dir / "checkpoint.h5", arrays, meta)


def test_resume_state_restores_counters_and_trims_rounds(tmp_path):
    config = Config().to_dict()
    _round_rows(tmp_path / "rounds.csv", range(5))
    _save_run_checkpoint(tmp_path, 2, config, np.arange(4, dtype=np.float32))
    state = load_resume_state(tmp_path, config)
    assert state.next_round == 3 and state.previous_workers == 3
    assert (state.steps, state.lr_scale, state.wall_seconds, state.traffic_bytes) == (40, 0.5, 12.5, 1000)
    assert (state.best_value, state.best_round, state.wait) == (0.9, 2, 1)
    np.testing.assert_array_equal(state.best_weights.read(), np.arange(4) * 2)  # left on disk until wanted
    assert [row["round"] for row in state.rounds] == [0, 1, 2]
    assert state.rollbacks == [{"round": 1}]
    assert list(state.optimizer_states) == [1] and state.optimizer_states[1].read().tolist() == [1, 1, 1]


def test_resume_refuses_another_model_naming_the_key(tmp_path):
    _save_run_checkpoint(tmp_path, 0, Config().to_dict(), np.zeros(4, dtype=np.float32))
    other = load_config(None, ["model.name=cnn"]).to_dict()
    with pytest.raises(ConfigError, match=r"model\.name='cnn' \(checkpoint: 'mlp'\)"):
        load_resume_state(tmp_path, other)
    state = load_resume_state(tmp_path, Config().to_dict())
    with pytest.raises(ConfigError, match="holds 4 weights, the model built from model.name='mlp' has 5"):
        check_weight_count(state, 5, "mlp")


def test_resume_without_checkpoint_starts_over(tmp_path):
    _round_rows(tmp_path / "rounds.csv", range(2))
    assert load_resume_state(tmp_path, Config().to_dict()) is None
    assert not (tmp_path / "rounds.csv").exists()


def test_torn_latest_checkpoint_falls_back_to_backup_with_warning(tmp_path, caplog):
    path = tmp_path / "checkpoint.h5"
    save_checkpoint(path, {"weights": np.full(3, 1.0, np.float32)}, {"round": 1})
    save_checkpoint(path, {"weights": np.full(3, 2.0, np.float32)}, {"round": 2})
    path.write_bytes(path.read_bytes()[:100])  # torn write of the latest
    arrays, meta = load_checkpoint(path)
    assert meta["round"] == 1 and arrays["weights"].tolist() == [1.0, 1.0, 1.0]
    assert "trying the backup" in caplog.text


WRITER = """
import sys, numpy as np
from pathlib import Path
from mpi_trainer.persistence.checkpoint import save_checkpoint
path = Path(sys.argv[1])
for index in range(10**6):
    save_checkpoint(path, {"weights": np.full(200_000, index, np.float32)}, {"round": index})
    print(index, flush=True)
"""


def test_killing_the_writer_mid_checkpoint_always_leaves_a_loadable_checkpoint(tmp_path):
    """kill -9 of the checkpoint writer at random moments, many times: the checkpoint always loads whole."""
    path, rng = tmp_path / "checkpoint.h5", random.Random(0)
    last_round, torn = -1, 0
    for _ in range(12):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                                  text=True)
        writer.stdout.readline()  # at least one checkpoint of this writer is complete
        time.sleep(rng.uniform(0.0, 0.15))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        tmp = path.with_name(path.name + ".tmp")
        torn += tmp.exists()  # killed in the middle of a write
        tmp.unlink(missing_ok=True)
        arrays, meta = load_checkpoint(path)
        assert np.all(arrays["weights"] == meta["round"])  # weights and metadata from the same save
        last_round = meta["round"]
    print(f"{torn} of 12 kills landed mid-write")
    assert last_round >= 0 and torn > 0


def test_nan_guard_names_the_ranks_and_decides_by_policy():
    good = np.ones(3, np.float32)
    outcomes = [nan_guard.WorkerOutcome(1, 0.3, True), nan_guard.WorkerOutcome(2, math.nan, False)]
    cause = nan_guard.non_finite_cause(outcomes, good)
    assert cause == ("non-finite training loss from worker rank(s) [2]; "
                     "non-finite weights from worker rank(s) [2]")
    inf = np.array([1.0, np.inf])
    assert nan_guard.non_finite_cause(outcomes[:1], inf) == "non-finite aggregated weights"
    assert nan_guard.non_finite_cause(outcomes[:1], good) is None
    assert nan_guard.decide("stop", 0) == "stop"
    assert nan_guard.decide("rollback", 0) == "rollback"
    assert nan_guard.decide("rollback", nan_guard.MAX_CONSECUTIVE_ROLLBACKS) == "stop"


def test_step_budgets_end_exactly_on_max_steps():
    full = {1: 21, 2: 21, 3: 20}
    assert steps_per_round(647, 32) == 21
    assert step_budgets(62, full) is None
    assert step_budgets(100, full) is None
    assert step_budgets(22, full) == {1: 8, 2: 7, 3: 7}
    assert step_budgets(61, full) == {1: 21, 2: 20, 3: 20}
    assert step_budgets(0, full) == {1: 0, 2: 0, 3: 0}
    assert step_budgets(42, {1: 40, 2: 3}) == {1: 39, 2: 3}


def test_optimizer_state_round_trips_and_maps_onto_fewer_or_more_workers():
    import keras

    from mpi_trainer.persistence.optimizer_state import assign_states, ensure_built, load_state_vector, state_vector

    def model() -> keras.Model:
        built = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        built.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        ensure_built(built)
        return built

    trained, fresh = model(), model()
    trained.fit(np.ones((8, 3)), np.zeros((8, 2)), epochs=2, verbose=0)
    vector = state_vector(trained.optimizer)
    assert vector.size == 1 + 2 * (3 * 2 + 2) and vector[0] == 2  # step counter, then the moments
    assert not np.any(state_vector(fresh.optimizer))
    load_state_vector(fresh.optimizer, vector)
    np.testing.assert_array_equal(state_vector(fresh.optimizer), vector)
    assert float(fresh.optimizer.learning_rate) == pytest.approx(0.01)  # the rate is the scheduler's
    with pytest.raises(ValueError, match="needs 17"):
        load_state_vector(fresh.optimizer, vector[:5])
    saved = {1: np.zeros(2), 2: np.ones(2), 3: np.full(2, 3.0)}
    assert {w: v[0] for w, v in assign_states(saved, [1, 2]).items()} == {1: 0, 2: 1}
    assert {w: v[0] for w, v in assign_states(saved, [1, 2, 3, 4]).items()} == {1: 0, 2: 1, 3: 3, 4: 0}
    assert assign_states({}, [1, 2]) == {}
