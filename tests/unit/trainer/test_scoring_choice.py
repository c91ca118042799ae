"""Where ``evaluation.where = "auto"`` scores the validation data: on the workers where every one is on a GPU,
on rank 0 otherwise; a value the user set is kept."""

from __future__ import annotations

import pytest

from mpi_trainer.config.loader import load_config
from mpi_trainer.errors import ConfigError
from mpi_trainer.launch.devices import RankPlacement
from mpi_trainer.trainer.scoring_choice import choose_place, resolve_place


def placements(*worker_devices: str) -> list[RankPlacement]:
    scheduler = RankPlacement(0, "node01", 0, "scheduler", "jax", "cpu")
    return [scheduler, *(RankPlacement(rank, "node01", rank, "worker", "jax", device)
                         for rank, device in enumerate(worker_devices, start=1))]


def test_auto_is_the_default_and_shares_the_scoring_out_only_where_every_worker_is_on_a_gpu():
    cfg = load_config({})
    assert cfg.evaluation.where == "auto"
    where, why = choose_place(cfg, placements("cuda:0", "cuda:0"))
    assert where == "workers" and "every worker trains on a GPU" in why
    where, why = choose_place(cfg, placements("cuda:0", "cpu"))
    assert where == "scheduler" and "worker rank(s) [2] train on the CPU" in why
    resolved, _ = resolve_place(cfg, placements("cpu", "cpu"))
    assert resolved.evaluation.where == "scheduler" and not resolved.evaluation.on_workers


@pytest.mark.parametrize("settings, said", [({"aggregation": {"ssp": 2}}, "under SSP"),
                                            ({"model": {"optimizer": "lbfgs"}}, "L-BFGS"),
                                            ({"train": {"overlap_eval": True}}, "train.overlap_eval: rank 0 scores")])
def test_auto_keeps_the_scoring_on_rank_0_where_the_workers_cannot_score_between_rounds(settings, said):
    where, why = choose_place(load_config(settings), placements("cuda:0", "cuda:1"))
    assert where == "scheduler" and said in why


@pytest.mark.parametrize("where", ["scheduler", "workers"])
def test_a_place_the_user_set_is_kept_whatever_the_devices(where):
    cfg = load_config({"evaluation": {"where": where}})
    for devices in (("cpu", "cpu"), ("cuda:0", "cuda:1")):
        assert choose_place(cfg, placements(*devices)) == (where, f"set by evaluation.where = {where!r}")


def test_an_unknown_place_is_refused_naming_the_choices():
    with pytest.raises(ConfigError, match=r"evaluation.where.*\['auto', 'scheduler', 'workers'\].*'everywhere'"):
        load_config({"evaluation": {"where": "everywhere"}})
