"""Workers on JAX and PyTorch, in one process each: a user's conv model with augmentation, checkpointed
optimizer state that a resumed worker loads back, and the Keras-native input feed.

The suite's own process already runs Keras on TensorFlow, and a Keras process keeps its first backend,
so each backend gets a fresh Python with ``KERAS_BACKEND`` set.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[2]

JOB = """
import json, sys
from pathlib import Path
import keras, numpy as np
from local_job import run_local_job
from mpi_trainer.models import rebuild_model
from mpi_trainer.persistence.optimizer_state import ensure_built, load_state_vector, state_vector
from mpi_trainer.persistence.resume import load_resume_state

run_dir = Path(sys.argv[1])
job = run_local_job(run_dir, workers=2, model={"name": "user_models:small_cnn", "learning_rate": 0.01},
                    data={"augmentation": {"enabled": True, "rotation": 0.1, "flip": "horizontal"}},
                    checkpoint={"every": 1}, train={"epochs": 2})
saved = {rank: state.read() for rank, state in load_resume_state(run_dir, job.engine.cfg.to_dict())
         .optimizer_states.items()}
live = {w.rank: state_vector(w.model.optimizer) for w in job.workers}
resumed = rebuild_model(job.engine.plan.model)  # a worker of the resumed run
ensure_built(resumed)
load_state_vector(resumed.optimizer, saved[1])
feed = job.workers[0].data.for_round(0).fit_input(32, np.random.default_rng(0), None)
print(json.dumps({
    "backend": keras.backend.backend(),
    "accuracy": job.summary["final_test_accuracy"],
    "weights_dtype": str(job.engine.weights.dtype),
    "saved_ranks": sorted(saved),
    "saved_is_live": all(np.array_equal(saved[r], live[r]) for r in live),
    "resumed_iterations": int(np.asarray(resumed.optimizer.iterations)),
    "resumed_matches": bool(np.array_equal(state_vector(resumed.optimizer), saved[1])),
    "feed": type(feed["x"]).__name__,
}))
"""


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@pytest.mark.parametrize("backend", [
    pytest.param("jax", marks=pytest.mark.skipif(not installed("jax"), reason="jax is not installed "
                                                 "(pip install -e '.[jax]')")),
    pytest.param("torch", marks=pytest.mark.skipif(not installed("torch"), reason="torch is not installed: "
                                                   "its PyPI wheel with CUDA libraries is several GB, too large "
                                                   "for CI here; install torch to run this test")),
])
def test_a_job_trains_checkpoints_and_resumes_optimizer_state_on(backend, tmp_path):
    path = os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "KERAS_BACKEND": backend, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", JOB, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["backend"] == backend and result["weights_dtype"] == "float32"
    assert result["accuracy"] > 0.5  # ten classes: chance is 0.1
    assert result["saved_ranks"] == [1, 2] and result["saved_is_live"]
    # Two rounds of adam: the step counter travels with the moments.
    assert result["resumed_iterations"] > 0 and result["resumed_matches"]
    assert result["feed"] == "ShuffledBatches"
