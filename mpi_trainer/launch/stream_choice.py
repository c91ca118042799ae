"""``data.stream = "auto"``: whether the job reads a file in batches, decided at its start from each rank's
memory (:mod:`mpi_trainer.data.memory`); every rank takes the decision, and the log says why."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.config import Config
from mpi_trainer.launch.agreement import agree
from mpi_trainer.logs import get_logger

if TYPE_CHECKING:
    from mpi_trainer.data.memory import StreamDecision


def resolve_stream(transport: RankTransport, cfg: Config) -> Config:
    """``data.stream = "auto"`` decided (:mod:`mpi_trainer.data.memory`): every rank estimates whether a
    worker's block fits its memory, and the job streams when any rank's would not. Logged on rank 0."""
    if not cfg.data.stream_auto:
        return cfg
    from mpi_trainer.data.memory import StreamDecision, decide

    _, node_ranks = transport.node_layout()
    decision = decide(cfg.data.source, transport.workers, len(node_ranks)) if cfg.data.is_file \
        else StreamDecision(False, None, 0)
    tight = [rank for rank, streams in enumerate(transport.allgather(decision.stream)) if streams]
    error = None
    if tight:
        error = _stream_refusal(cfg, decision)
    agree(transport, error)
    if transport.rank == 0 and cfg.data.is_file:
        get_logger().info("%s%s", decision.describe(),
                          f"; ranks {tight} would not fit their blocks" if tight and not decision.stream else "")
    return with_stream(cfg, bool(tight))


def with_stream(cfg: Config, stream: bool) -> Config:
    from dataclasses import replace

    return replace(cfg, data=replace(cfg.data, stream=stream))


def _stream_refusal(cfg: Config, decision: StreamDecision) -> str | None:
    """The block does not fit in memory, and the config asks what streaming cannot give: say both."""
    from mpi_trainer.data.adapters.files import stream_dataset
    from mpi_trainer.data.streamed import refusals, streamed_train

    streamed = streamed_train(stream_dataset(cfg.data))
    refused = refusals(with_stream(cfg, True), streamed.adapter) if streamed is not None else []
    if not refused:
        return None
    return (f"A worker's block of {cfg.data.source!r} would not fit in memory, so data.stream = \"auto\" streams "
            f"it from disk, but: {refused[0]}. {decision.describe()}")

