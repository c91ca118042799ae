"""What both scheduler engines share: the global weights, the recorder, the watchdog, the run's frame.

An engine subclass supplies :meth:`Engine.run_rounds` (when workers run and
what they get, until a stop) and :meth:`Engine.final_states` (optimizer state
for the last checkpoint). Everything after a round's updates are in goes to the
:class:`~mpi_trainer.scheduler.recorder.RoundRecorder`; everything on the wire
goes through the :class:`~mpi_trainer.comm.protocol.SchedulerLink`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpi_trainer import hooks
from mpi_trainer.algorithms.rebalance import Measurement, Rebalancer
from mpi_trainer.algorithms.wait_bounds import WaitBounds
from mpi_trainer.comm.flat_weights import WeightCodec
from mpi_trainer.comm.protocol import JobPlan, Order, SchedulerLink
from mpi_trainer.comm.wire_dtype import WireFormat
from mpi_trainer.config import Config
from mpi_trainer.data.partition import block_bounds
from mpi_trainer.data.placement import moved_rows
from mpi_trainer.data.sources import Dataset
from mpi_trainer.errors import RankLost, WorkerFailure
from mpi_trainer.logs import get_logger
from mpi_trainer.persistence.resume import ResumeState
from mpi_trainer.persistence.run_record import NO_CONTEXT, RunContext
from mpi_trainer.scheduler.evaluation import Evaluator
from mpi_trainer.scheduler.recorder import RoundRecorder, RoundSources, StopReason
from mpi_trainer.scheduler.watchdog import Watchdog


class Engine(ABC):
    rebalancer: Rebalancer | None = None  # data.rebalance: the engine's own, cutting blocks by speed

    def __init__(self, link: SchedulerLink, cfg: Config, dataset: Dataset, model: Any, plan: JobPlan,
                 run_dir: Path, hosts: list[str] | None = None, resume: ResumeState | None = None,
                 context: RunContext = NO_CONTEXT) -> None:
        self.link, self.cfg, self.dataset, self.model, self.plan = link, cfg, dataset, model, plan
        self.log = get_logger()
        self.codec = WeightCodec.from_weights(model.get_weights())
        self.weights = self.codec.flatten(model.get_weights())  # the global model
        self.wire = WireFormat(cfg.aggregation.wire_dtype)  # what the weights travel as
        transport = link.transport
        hosts = hosts or [transport.host] * transport.size
        self.watchdog = Watchdog(WaitBounds(cfg.watchdog.setup_timeout, cfg.watchdog.worker_timeout), hosts)
        self.paced: float | None = None  # when the last round closed (or the rounds began)
        self.recorder = RoundRecorder(cfg, dataset, model, self.codec, plan, run_dir, transport, hosts,
                                      self.round_sources(), resume, context)
        self.observers = self.recorder.observers
        if resume is not None:
            self.weights = resume.weights
        self.workers = link.workers

    def round_sources(self) -> RoundSources:
        """What the recorder is built with: the scheduler scores the global model itself, and checkpoints
        hold no optimizer state (an engine that gathers them overrides this). Called while the base engine
        is built, before a subclass's own attributes exist."""
        return RoundSources(Evaluator(self.cfg, self.dataset, self.model, self.codec))

    @property
    def state(self) -> Any:
        return self.recorder.state

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """The rows of rounds.csv so far."""
        return self.recorder.state.rounds

    @property
    def run_dir(self) -> Path:
        return self.recorder.run_dir

    def run(self) -> dict[str, Any]:
        """Every round until a stop, then release the workers and write the end of the run."""
        self.recorder.count_bytes(self.link.take_bytes())  # the set-up broadcast
        self.log.info("%s", self.describe())
        self.pace(None)
        try:
            self.recorder.begin()
            self.state.stop_reason = self.run_rounds()
            states = self.final_states()
            try:
                self.link.stop(preempted=self.state.stop_reason == StopReason.PREEMPTED)
            except TimeoutError as exc:
                raise self.timed_out("take its order to stop", exc, self.workers) from None
            self.recorder.count_bytes(self.link.take_bytes())
            summary = self.recorder.finish(self.weights, states)
            self.weights = self.recorder.kept_weights
            return summary
        finally:
            self.close()

    @property
    def wire_bytes(self) -> int:
        """Bytes of one copy of the weights on the wire."""
        return self.codec.size * self.wire.itemsize

    def describe(self) -> str:
        return (f"{len(self.workers)} workers, {self.cfg.aggregation.method} aggregation, model "
                f"{self.cfg.model.name} ({self.codec.size} parameters, {self.codec.nbytes / 2**20:.2f} MiB per copy)")

    @abstractmethod
    def run_rounds(self) -> StopReason:
        """Rounds from the start (or resume) point until one says stop; returns why."""

    def final_states(self) -> dict[int, np.ndarray]:
        """Optimizer state for the final checkpoint (none by default)."""
        return {}

    def pace(self, closed: int | None) -> None:
        """Round ``closed`` has been recorded (None: the rounds begin): the watchdog learns how long the
        whole round took, and every wait from here on (this rank's, and through the orders the workers')
        follows the bound it derives."""
        now = time.perf_counter()
        if closed is not None and self.paced is not None:
            self.watchdog.observe(now - self.paced)
        self.paced = now
        transport = self.link.transport
        transport.bound = self.watchdog.timeout
        transport.phase = "the rounds" if closed is None else f"after round {closed}"
        if closed is not None:
            hooks.maybe_freeze(0, closed)

    def close(self) -> None:
        self.recorder.close()

    # -- rebalancing ----------------------------------------------------------------
    def seed_speeds(self, speeds: Mapping[int, Measurement], seconds: float = 0.0) -> None:
        """Rebalancing: cut the first round's blocks from the steps each worker timed before it.

        ``speeds``: worker rank -> its calibration (:meth:`Worker.calibrate`). Without it the
        first round would run on equal blocks at the slowest worker's pace. ``seconds``: how long
        the calibration took, counted in the run's wall time (elapsed_seconds, summary.json).
        """
        if self.rebalancer is None or not speeds:
            return
        self.state.wall_offset += seconds
        if self.rebalancer.update({rank - 1: speed for rank, speed in sorted(speeds.items())}):
            self.adopt_bounds(self.recorder.start_round)
            self.log.info("before round %d blocks cut by calibrated speed %s", self.recorder.start_round,
                          self.rebalancer.describe(self.workers))

    def adopt_bounds(self, start_round: int) -> None:
        """The rebalancer's blocks become the plan from ``start_round`` on (the orders carry them)."""
        self.plan.block_bounds = list(self.rebalancer.bounds)

    def hand_over_rows(self, worker: int, positions: np.ndarray, round_index: int) -> None:
        """Scatter: the rows that changed owner go to their new worker before it reads its block."""
        try:
            nbytes = self.link.send_rows(worker, moved_rows(self.dataset, positions), self.watchdog.timeout)
        except TimeoutError:
            raise self.watchdog.failure(f"take its training rows for round {round_index}", [worker]) from None
        if len(positions):
            self.log.info("round %d: sent worker rank %d %d training rows that changed owner (%.2f MB)",
                          round_index, worker, len(positions), nbytes / 1e6)

    # -- surviving a lost worker (fault.survive) ----------------------------------------
    def survive_loss(self, error: RankLost, next_round: int, where: str) -> None:
        """Shrink to the survivors, name the lost, re-plan their blocks from ``next_round`` on.

        Without ``fault.survive`` the loss ends the job as any error does. Below
        ``fault.min_workers`` the job checkpoints and exits for ``launch`` to restart it.
        """
        if not self.cfg.fault.survive:
            raise error
        while True:
            self.drop_lost(self.link.shrink(self.watchdog.timeout), where)
            try:
                self.link.agree()  # a rank lost during the shrink: shrink again
                break
            except RankLost:
                continue
        self.workers = self.link.workers
        if len(self.workers) < self.cfg.fault.min_workers:
            self.end_short_handed(next_round)
        self.replan(next_round)

    def drop_lost(self, shrunk: Any, where: str) -> None:
        """Forget the lost ranks' hosts (the others are renumbered in order) and say who was lost."""
        hosts = self.watchdog.hosts
        for rank, world_rank in zip(shrunk.lost, shrunk.lost_world):
            self.log.warning("%s: worker rank %d on host %s was lost; carrying on with %d workers", where,
                             world_rank, hosts[rank], len(shrunk.survivors) - 1)
            self.recorder.lost_workers.append({"rank": world_rank, "host": hosts[rank], "where": where})
        self.watchdog.hosts = [hosts[rank] for rank in shrunk.survivors]
        self.renumber(shrunk.survivors)

    def renumber(self, survivors: list[int]) -> None:
        """What the engine keeps per worker rank follows the survivors' new numbers (index in ``survivors``)."""
        return None  # nothing in the base engine is kept per rank

    def end_short_handed(self, next_round: int) -> None:
        """Fewer workers than ``fault.min_workers``: checkpoint the last recorded round, then fail."""
        last = int(self.state.rounds[-1]["round"]) if self.state.rounds else -1
        if last >= 0:  # with no round recorded yet, a restart starts over
            self.recorder.checkpoint(last, self.weights, self.recorder.optimizer_states())
        raise WorkerFailure(f"{len(self.workers)} workers left, fewer than fault.min_workers="
                            f"{self.cfg.fault.min_workers}; checkpointed after round {last} and ending the job "
                            f"for `launch` to restart it")

    def replan(self, next_round: int) -> None:
        """Blocks for the survivors, as an elastic resume plans them; the next orders carry them."""
        self.plan.block_bounds = block_bounds(self.plan.num_train, len(self.workers))
        if self.rebalancer is not None:
            self.rebalancer = Rebalancer(self.plan.block_bounds, self.cfg.data.rebalance_smoothing)
        self.log.info("blocks re-planned for %d workers from round %d: %s", len(self.workers), next_round,
                      ", ".join(f"[{start}, {end})" for start, end in self.plan.block_bounds))

    def send_order(self, worker: int, order: Order) -> None:
        """An order, which a worker that stopped taking messages cannot hold up for longer than the bound."""
        try:
            self.link.send_order(worker, order)
        except TimeoutError:
            raise self.watchdog.failure(f"take its order for {order.describe()}", [worker]) from None

    def timed_out(self, what: str, error: TimeoutError, ranks: list[int]) -> Exception:
        """The watchdog's failure for a wait that timed out, naming who was missing (else ``ranks``)."""
        return self.watchdog.failure(what, getattr(error, "missing", None) or ranks)
