"""Where a fit's validation data is scored when ``evaluation.where = "auto"`` (the default).

Scoring on the workers (``"workers"``) shares the validation rows out: each worker scores its share
with the combined state and rank 0 sums the metrics' states. It pays where the workers have what
rank 0 has not: accelerators. With two workers on one H200 and rank 0 on the CPU, a LeNet's scoring
took 0.52x rank 0's alone. Where the workers train on CPUs, their scoring runs on the cores rank 0's
would run on (rank 0 takes every core of its node while the workers wait): on 2 cores it took 1.02x
rank 0's, and it adds a hand-out of the state. So ``auto`` shares the scoring out when every worker
is on a GPU, and keeps it on rank 0 otherwise, or where the workers cannot score between rounds
(SSP, L-BFGS) or train the next round while rank 0 scores (``train.overlap_eval``). The choice and
its reason go into the log; a value set by the user is used as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mpi_trainer.config import Config
    from mpi_trainer.config.choices import EvaluationPlace


def choose_place(cfg: Config, placements: Sequence[Any]) -> tuple[EvaluationPlace, str]:
    """``evaluation.where`` in effect and why, from every rank's placement (the same on every rank)."""
    where = cfg.evaluation.where
    if where != "auto":
        return where, f"set by evaluation.where = {where!r}"
    said = "evaluation.where = \"auto\": "
    if cfg.aggregation.ssp > 0:
        return "scheduler", said + "under SSP the workers never wait for a round's scoring, so rank 0 scores"
    if cfg.model.uses_lbfgs:
        return "scheduler", said + "L-BFGS scores its iterates on rank 0"
    if cfg.train.overlap_eval:
        return "scheduler", said + ("train.overlap_eval: rank 0 scores each epoch while the workers train the "
                                    "next")
    workers = [placement for placement in placements if not placement.is_scheduler]
    on_cpu = [placement.rank for placement in workers if placement.on_cpu]
    if not workers or on_cpu:
        return "scheduler", (said + f"worker rank(s) {on_cpu} train on the CPU, whose cores rank 0's scoring uses "
                             f"as well; rank 0 scores (evaluation.where = \"workers\" shares it out)")
    return "workers", (said + "every worker trains on a GPU: each scores its share of the validation arrays "
                       "and rank 0 sums the metrics' states (evaluation.where = \"scheduler\" keeps it on rank 0)")


def resolve_place(cfg: Config, placements: Sequence[Any]) -> tuple[Config, str]:
    """``cfg`` with ``evaluation.where`` resolved (:func:`choose_place`), and why."""
    where, why = choose_place(cfg, placements)
    return dataclasses.replace(cfg, evaluation=dataclasses.replace(cfg.evaluation, where=where)), why
