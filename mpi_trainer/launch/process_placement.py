"""Where this process runs: its device, its threads and its cores, fixed once before its backend starts.

A Keras backend reads its GPUs and sizes its thread pools once, when it starts. The first job in a
process (or :func:`mpi_trainer.init`) places it and gets a :class:`PlacedProcess`; the caller keeps
that object and hands it to later jobs, which follow it (a config asking for another placement is
refused on every rank). Nothing here is remembered between calls.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, fields, replace
from typing import Any

from mpi_trainer.comm.interface import RankTransport
from mpi_trainer.config import Config, TrainConfig
from mpi_trainer.errors import InputError
from mpi_trainer.launch.agreement import agree, agreed
from mpi_trainer.launch.devices import (
    RankPlacement,
    backend_environment,
    backend_sees_gpu,
    backend_started,
    check_training_backend,
    choose_placement,
    configured_backend,
    confirm_placement,
    discover_gpus,
    refuse_started_backend,
)
from mpi_trainer.launch.runtime import (
    JAX_CALLBACK_CORES,
    allowed_cores,
    configure_threads,
    threads_for_rank,
    usable_cores,
    worker_cores,
)
from mpi_trainer.logs import get_logger

PLACEMENT_KEYS = ("device", "scheduler_device", "threads", "bind_cores")  # the train.* values a placement follows


@dataclass
class PlacedProcess:
    """Where this process's job runs (every rank's :class:`RankPlacement`), and the ``train.*`` values
    it was chosen from."""

    placements: list[RankPlacement]
    settings: dict[str, Any]


def place_or_follow(transport: RankTransport, cfg: Config,
                    placed: PlacedProcess | None) -> tuple[Config, PlacedProcess]:
    """Place this process (``placed`` is None: its first job), or make ``cfg`` follow ``placed``.

    Returns the config the job runs with and the placement the caller keeps for later jobs."""
    if placed is None:
        return cfg, PlacedProcess(place_process(transport, cfg), placement_settings(cfg))
    return follow_placement(transport, cfg, placed.settings), placed


def placement_settings(cfg: Config) -> dict[str, Any]:
    return {key: getattr(cfg.train, key) for key in PLACEMENT_KEYS}


def follow_placement(transport: RankTransport, cfg: Config, settings: dict[str, Any]) -> Config:
    """A job in a process placed already takes that placement's ``train.*`` values; one that asks for
    other values than the defaults is refused on every rank (a started backend cannot move)."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.name in PLACEMENT_KEYS}
    error = None
    for key, chosen in settings.items():
        asked = getattr(cfg.train, key)
        if asked != chosen and asked != defaults[key]:
            error = (f"`train.{key}` differs from the placement this process already has: its backend started "
                     f"with train.{key}={chosen!r} (mpi_trainer.init() or an earlier job) and cannot move. "
                     f"Received: train.{key}={asked!r}; expected {chosen!r}, or the setting left out")
            break
    agree(transport, error)
    return replace(cfg, train=replace(cfg.train, **settings))


def place_process(transport: RankTransport, cfg: Config) -> list[RankPlacement]:
    """This rank's device and threads, set before its backend starts; every rank's placement."""
    node_cores, node_ranks = transport.node_layout()
    placement, started = place_rank(transport, cfg, node_ranks)  # before anything imports the backend
    threads = threads_for_rank(transport.rank, node_cores, node_ranks, usable_cores(), cfg.train.threads)
    placement = bind_to_cores(placement, cfg, node_cores, node_ranks, threads)
    if started and placement.backend != "torch":  # PyTorch alone resizes its pools at any time
        get_logger().debug("the %s runtime had started: its own threads, not %d", placement.backend, threads)
    else:
        configure_threads(threads)
        placement = replace(placement, threads=threads)
        get_logger().debug("%d threads (%d cores, ranks on this node: %s)", threads, node_cores, node_ranks)
    return confirm_rank(transport, cfg, placement)


def backend_installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def bind_to_cores(placement: RankPlacement, cfg: Config, node_cores: int, node_ranks: list[int],
                  threads: int) -> RankPlacement:
    """``train.bind_cores``: a CPU worker keeps to its own cores, before its backend starts its threads
    (they inherit it). Not where mpirun bound the rank already, nor where the workers do not fit, nor a JAX
    worker of synchronous SGD onto fewer cores than its per-step sum needs (:data:`JAX_CALLBACK_CORES`)."""
    allowed = allowed_cores()
    if (not cfg.train.bind_cores or placement.is_scheduler or not placement.on_cpu
            or allowed is None or len(allowed) < node_cores):
        return placement
    cores = worker_cores(placement.rank, node_ranks, threads, allowed)
    if cores is None or (len(cores) < JAX_CALLBACK_CORES and placement.backend == "jax"
                         and cfg.aggregation.synchronous):
        return placement
    os.sched_setaffinity(0, cores)
    return replace(placement, cores=cores)


def place_rank(transport: RankTransport, cfg: Config, node_ranks: list[int]) -> tuple[RankPlacement, bool]:
    """Choose this rank's device and narrow the visible GPUs to it; a rank that cannot fails them all.

    Also says whether the backend had started already (too late to narrow GPUs or size threads):
    on a node with GPUs that fails every rank.
    """
    placement, started, error = None, False, None
    try:
        backend = configured_backend()
        check_training_backend(backend, backend_installed)
        inventory = discover_gpus()
        placement = choose_placement(transport.rank, transport.host, node_ranks, cfg.train.device,
                                     cfg.train.scheduler_device, inventory, backend)
        started = backend_started(backend)
        if started:
            refuse_started_backend(placement, inventory)
        os.environ.update(backend_environment(placement))
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return agreed(placement), started


def confirm_rank(transport: RankTransport, cfg: Config, placement: RankPlacement) -> list[RankPlacement]:
    """Check that each GPU rank's backend sees its GPU; every rank learns where every rank runs."""
    error = None
    try:
        requested = cfg.train.scheduler_device if placement.is_scheduler else cfg.train.device
        placement = confirm_placement(placement, requested, backend_sees_gpu)
    except InputError as exc:
        error = str(exc)
    agree(transport, error)
    return transport.allgather(placement)


def log_placements(placements: list[RankPlacement]) -> None:
    log = get_logger()
    for placement in placements:
        why = f" (aggregates in NumPy, evaluates on {placement.device})" if placement.is_scheduler else ""
        log.info("%s%s%s", placement.describe(), ", the backend's own threads" if placement.threads is None else "",
                 why)
    unsized = [p.rank for p in placements if p.threads is None]
    if unsized:
        log.warning("ranks %s: the Keras backend had started before the job could size its threads (the script "
                    "built or ran a model first), so each keeps the backend's default pools, which may "
                    "oversubscribe the cores; call mpi_trainer.init() at the top of the script, before Keras "
                    "builds anything", ", ".join(map(str, unsized)))
