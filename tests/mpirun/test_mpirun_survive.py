"""Real ``mpirun`` jobs with ``fault.survive``: a worker killed mid-round, the job shrinks and carries on."""

from __future__ import annotations

from conftest import run_mpi

from mpi_trainer.launch.mpirun import FAULT_TOLERANT_OPTIONS

EPOCHS = 15
QUICK = ["configs/quickstart.toml", "--set", f"train.epochs={EPOCHS}", "--set", "log.plots=false",
         "--set", "log.tensorboard=false"]
SURVIVE = ["--set", "fault.survive=true"]
# worker rank 2 ends itself with SIGKILL in round 2, after its report, before its weights go into the sum
KILL = ["--set", "debug.crash_rank=2", "--set", "debug.crash_round=2"]
# fault-tolerant MPI runs over TCP: keep it on the loopback, away from the simulated hosts other tests create
# and remove meanwhile (a connection made from a vanished bridge's address never completes)
LOOPBACK = {"OMPI_MCA_btl_tcp_if_include": "lo"}


def test_a_killed_worker_leaves_two_that_finish_every_round_without_a_restart(tmp_path):
    # the workers score their test shards until the loss, then the scheduler scores the whole split
    survived = run_mpi(4, ["train", *QUICK, *SURVIVE, *KILL, "--set", "evaluation.where=workers"],
                       tmp_path / "survived", mpirun_args=FAULT_TOLERANT_OPTIONS, extra_env=LOOPBACK)
    assert survived.returncode == 0, survived.output[-4000:]
    rows = survived.rounds()
    assert [int(r["round"]) for r in rows] == list(range(EPOCHS))  # each once: round 2 is not logged twice
    assert [int(r["workers"]) for r in rows] == [3, 3] + [2] * (EPOCHS - 2)
    summary = survived.summary()
    assert summary["workers"] == 2 and summary.get("restarts") is None
    assert [lost["rank"] for lost in summary["lost_workers"]] == [2]
    assert "round 2: worker rank 2 on host" in survived.output and "was lost" in survived.output
    # the two survivors score their shards of the test split from then on; as accurate as an undisturbed run
    # (0.97 to 0.98 over its last five rounds): one round 2 pp off moves this mean by 0.4 pp
    assert sum(float(r["test_accuracy"]) for r in rows[-5:]) / 5 >= 0.95, rows[-5:]


