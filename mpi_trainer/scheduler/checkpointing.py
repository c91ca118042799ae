"""The recorder's checkpoints: when one is due, what it holds, and the weights a NaN rollback goes back to.

A mixin of :class:`~mpi_trainer.scheduler.recorder.RoundRecorder`, which owns the
state it reads (the run's counters, early stopping, the outer optimizer).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mpi_trainer.persistence.checkpoint import load_checkpoint, save_checkpoint
from mpi_trainer.persistence.optimizer_state import ARRAY_PREFIX
from mpi_trainer.persistence.resume import worker_seed
from mpi_trainer.persistence.run_files import CHECKPOINT_NAME, backup_path
from mpi_trainer.persistence.run_record import KEEPS_BEST


class RecorderCheckpoints:
    """Checkpoint decisions and writing, for :class:`~mpi_trainer.scheduler.recorder.RoundRecorder`."""

    def checkpoint_due(self, round_index: int) -> bool:
        """Every ``checkpoint.every`` rounds, after ``every_seconds``, or on preemption; decided once a round
        (the engine asks before the round closes, the evaluation and the checkpoint while it does)."""
        if self.due is not None and self.due[0] == round_index:
            return self.due[1]
        every, seconds = self.cfg.checkpoint.every, self.cfg.checkpoint.every_seconds
        due = ((every > 0 and (round_index + 1) % every == 0) or self.preempting()
               or (seconds > 0 and time.monotonic() - self.last_checkpoint >= seconds))
        self.due = (round_index, due)
        return due

    def maybe_checkpoint(self, round_index: int, weights: np.ndarray) -> None:
        if self.checkpoint_due(round_index):
            self.checkpoint(round_index, weights, self.optimizer_states())

    def checkpoint(self, round_index: int, weights: np.ndarray, states: dict[int, np.ndarray]) -> None:
        begun = time.perf_counter()
        arrays = {"weights": weights}
        if self.early.best_weights is not None:
            arrays["best_weights"] = self.early.best_weights
        arrays.update({f"{ARRAY_PREFIX}{rank}": vector for rank, vector in states.items()})
        arrays.update(self.outer.state_arrays())
        save_checkpoint(self.run_dir / CHECKPOINT_NAME, arrays, self.checkpoint_meta(round_index))
        self.last_checkpoint, self.last_checkpoint_round = time.monotonic(), round_index
        self.observers.span("checkpoint", round_index, begun)
        self.log.debug("checkpoint written after round %d", round_index)

    def checkpoint_meta(self, round_index: int) -> dict[str, Any]:
        workers = range(1, self.workers + 1)
        return {"round": round_index, "rounds_completed": round_index + 1,
                "best_value": self.early.best_value, "best_round": self.early.best_round,
                "wait": self.early.wait, "monitor": self.early.monitor,
                "block_bounds": self.plan.block_bounds, "shuffle_seed": self.plan.shuffle_seed,
                "traffic_bytes": self.state.traffic_bytes, "config": self.cfg.to_dict(),
                "steps": self.state.steps, "lr_scale": self.state.lr_scale, "wall_seconds": self.elapsed(),
                "rollbacks": self.state.rollbacks, "workers": self.workers, "optimizer": self.cfg.model.optimizer,
                "fingerprint": self.fingerprint,
                "rng_seeds": {"train": self.cfg.train.seed, "shuffle": self.plan.shuffle_seed,
                              "workers": [worker_seed(self.cfg.train.seed, w, self.start_round) for w in workers]}}

    def needs_final_checkpoint(self) -> bool:
        """False when the last round's checkpoint already holds what the end would write."""
        if not self.state.rounds:
            return False
        last = int(self.state.rounds[-1]["round"])
        return self.last_checkpoint_round != last or self.state.stop_reason in KEEPS_BEST

    def last_good_weights(self) -> tuple[np.ndarray, int]:
        """The latest checkpoint's weights and round, or the initial weights (round -1) before one.

        The outer optimizer goes back with them: to the checkpoint's state, or fresh before one.
        """
        path = self.run_dir / CHECKPOINT_NAME
        if path.exists() or backup_path(path).exists():
            arrays, meta = load_checkpoint(path)
            self.outer.load_state(arrays, self.codec.size)
            return arrays["weights"].astype(np.float32), int(meta["round"])
        self.outer.reset()
        return self.initial_weights.copy(), -1
