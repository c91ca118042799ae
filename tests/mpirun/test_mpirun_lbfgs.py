"""Full-batch L-BFGS under real mpirun: the logged losses are those of SciPy run directly on the whole data.
(The iterates against SciPy's with the rows shared among threads, resume and refusals: in one process,
tests/unit/trainer/test_lbfgs_fit.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_mpi
from lbfgs_reference import digits_softmax_problem, scipy_losses, softmax_regression_objective

from mpi_trainer.trainer.state import ModelState

ITERATIONS = 5


@pytest.fixture(scope="module")
def reference_losses() -> list[float]:
    x, y, classes, model = digits_softmax_problem(seed=0, validation_size=0.1)
    return scipy_losses(softmax_regression_objective(x, y, classes), ModelState(model).read_trainable(), ITERATIONS)


def test_lbfgs_losses_match_the_single_process_reference(reference_losses, tmp_path):
    ranks, run_dir = 3, tmp_path / "lbfgs"
    result = run_mpi(ranks, ["train", "configs/digits_lbfgs.toml", "--set", f"train.epochs={ITERATIONS}",
                             "--set", "early_stopping.patience=0", "--set", "checkpoint.every=2"], run_dir)
    assert result.returncode == 0, result.output
    rows = result.rounds()
    assert [int(r["round"]) for r in rows] == list(range(ITERATIONS))
    np.testing.assert_allclose([float(r["train_loss"]) for r in rows], reference_losses, rtol=1e-5)
    summary = result.summary()
    assert summary["workers"] == ranks - 1 and summary["stop_reason"] == "epochs"
    assert summary["function_evaluations"] == int(rows[-1]["function_evaluations"]) >= ITERATIONS + 1
    assert summary["final_test_accuracy"] > 0.85
    for name in ("config.toml", "train.log", "checkpoint.h5", "final.weights.h5"):
        assert (run_dir / name).is_file(), name
