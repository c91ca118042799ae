"""The scripts in examples/ run under ``mpirun -n 3`` as a user runs them, at a tiny scale."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from mpi_trainer.launch.mpirun import mpirun_command

# Examples with checks of their own: run in the corpus's mpirun job, with these command lines.
CHECKED = {
    "test_the_examples_train_under_mpirun": ["horovod_keras_mnist.py --epochs 2",
                                             "structured_data_classification.py --epochs 4"],
    "test_the_multi_output_example_trains_under_mpirun": ["multi_output.py --epochs 3"],
}


def outputs(corpus: dict, name: str) -> list[str]:
    """Each rank's output of ``name`` in the mpirun job (an error fails the test with its traceback)."""
    reports = [corpus["mpirun"].get((name, rank)) for rank in range(3)]
    assert all(report is not None for report in reports), reports
    assert all(report["error"] is None for report in reports), [report["error"] for report in reports]
    return [report["output"] for report in reports]


def test_the_examples_train_under_mpirun(corpus):
    # Horovod's Keras MNIST, ported: an unbuilt Sequential, ModelCheckpoint on rank 0, History on every rank
    output = "".join(outputs(corpus, "horovod_keras_mnist.py"))
    losses = [float(v) for v in re.findall(r"rank-local check: final training loss (\S+)", output)]
    assert len(losses) == 3 and len(set(losses)) == 1, output  # the same History on every rank
    assert sorted(p.name for p in (corpus["mpirun_dir"] / "horovod_keras_mnist").glob(
        "checkpoint-*.weights.h5")) == ["checkpoint-1.weights.h5", "checkpoint-2.weights.h5"]
    # dict inputs, validation_split and class_weight
    output = "".join(outputs(corpus, "structured_data_classification.py"))
    recall = re.search(r"held-out rows: accuracy (\S+), recall (\S+)", output)
    assert recall and float(recall.group(1)) > 0.85 and float(recall.group(2)) > 0.8, output


def test_the_multi_output_example_trains_under_mpirun(corpus):
    # a functional model with two heads: y as a dict per output, each scored under its Keras name
    output = "".join(outputs(corpus, "multi_output.py"))
    keys = re.findall(r"rank \d: history keys (.+)", output)
    assert len(keys) == 3 and len(set(keys)) == 1 and "'val_even_auc'" in keys[0], output
    held_out = re.search(r"held-out images: digit accuracy ([\d.]+), even accuracy ([\d.]+)", output)
    assert held_out and float(held_out.group(1)) > 0.8 and float(held_out.group(2)) > 0.75, output


# The corpus: each script is a plain Keras 3 script ported with two lines, ending with one
# `Test <metric>: <value>` line. tests/mpirun/examples_job.py runs them all in one process: once as the
# plain Keras scripts they were ported from (one process, the baseline), once under `mpirun -n 3`.
# Every rank must print the same value, within TOLERANCES[name] of the baseline. Data-parallel training
# averages two workers' models once per epoch, each worker taking half the steps of plain `fit`, so the
# few-epoch scripts land a little apart; the tolerances are about twice the gaps measured (plain vs mpirun,
# in docs/examples.md) and at least 0.05 for an accuracy.
EXAMPLES_JOB = ROOT / "tests" / "mpirun" / "examples_job.py"
TOLERANCES = {  # example: (metric, largest |mpirun - plain| accepted)
    "mnist_convnet.py": ("accuracy", 0.08),
    "batchnorm_augmentation.py": ("accuracy", 0.08),
    "custom_train_step.py": ("accuracy", 0.05),
    "custom_objects.py": ("accuracy", 0.06),
    "subclassed_model.py": ("accuracy", 0.05),
    "mixed_precision.py": ("accuracy", 0.05),
    "text_classification.py": ("accuracy", 0.05),
    "text_dataset.py": ("accuracy", 0.05),
    "normalization_adapt.py": ("accuracy", 0.05),
    "transfer_learning.py": ("accuracy", 0.08),
    "gan.py": ("discriminator_accuracy", 0.3),
    "masking_rnn.py": ("accuracy", 0.08),
    "add_loss.py": ("accuracy", 0.1),
    "tf_data_pipeline.py": ("accuracy", 0.05),
    "py_dataset.py": ("accuracy", 0.05),
    "callbacks.py": ("accuracy", 0.05),
    "regression_sample_weight.py": ("mae", 5.0),
    "class_weight.py": ("recall", 0.12),
    "multi_input_output.py": ("digit_accuracy", 0.06),
}
KNOWN_FAILURES: dict[str, str] = {}  # example -> why it fails under mpirun (an xfail while it does)
PORTED_IN_ONE_PROCESS = "custom_train_step.py"  # also run ported, in the plain job (the real mpi_trainer)
CORPUS_SECONDS = 900  # each job, on a loaded 2-core machine


def start_examples_job(command: list[str], cwd) -> subprocess.Popen:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": path}
    return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def examples_job_reports(job: subprocess.Popen) -> dict[tuple[str, int], dict]:
    """The job's JSON reports, by (example, rank)."""
    try:
        stdout, stderr = job.communicate(timeout=CORPUS_SECONDS)
    except subprocess.TimeoutExpired:
        job.kill()
        stdout, stderr = job.communicate()
        pytest.fail(f"{job.args[0]} did not finish within {CORPUS_SECONDS} s:\n{stdout}\n{stderr}")
    assert job.returncode == 0, stdout + stderr
    reports = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return {(report["example"], report["rank"]) if report["keras_only"] or report["size"] > 1
            else ("ported", report["example"]): report for report in reports}


def selected_examples(session) -> list[str]:
    """The examples whose test this session runs (``-k gan`` runs the jobs on gan.py alone)."""
    chosen = {item.callspec.params["name"] for item in session.items
              if item.originalname == "test_an_example_scores_under_mpirun_as_in_plain_keras"}
    return [name for name in TOLERANCES if name in chosen]


@pytest.fixture(scope="module")
def corpus(request, tmp_path_factory) -> dict:
    """Both runs of the selected examples, side by side: {"plain": reports, "mpirun": reports,
    "mpirun_dir": the mpirun job's directory}; the mpirun job also runs the CHECKED examples selected."""
    selected = selected_examples(request.session)
    if any(item.originalname == "test_a_ported_example_run_as_one_process_is_plain_keras"
           for item in request.session.items) and PORTED_IN_ONE_PROCESS not in selected:
        selected.append(PORTED_IN_ONE_PROCESS)  # its plain Keras score is the reference
    paths = [str(ROOT / "examples" / name) for name in selected]
    plain_dir, mpi_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("mpirun")
    ported = [str(ROOT / "examples" / PORTED_IN_ONE_PROCESS)] if PORTED_IN_ONE_PROCESS in selected else []
    checked = [str(ROOT / "examples" / line) for item in request.session.items
               for line in CHECKED.get(item.originalname, [])]
    plain = start_examples_job([sys.executable, str(EXAMPLES_JOB), str(plain_dir), "--keras-only", *paths,
                                "--ported", *ported], plain_dir) if paths else None
    job = [sys.executable, str(EXAMPLES_JOB), str(mpi_dir), *paths, *checked]
    data_parallel = start_examples_job(mpirun_command(3, [], program=job), mpi_dir)
    return {"plain": examples_job_reports(plain) if plain else {}, "mpirun": examples_job_reports(data_parallel),
            "mpirun_dir": mpi_dir}


def _corpus_param(name: str):
    if name in KNOWN_FAILURES:
        return pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_FAILURES[name], strict=False))
    return name


@pytest.mark.parametrize("name", [_corpus_param(name) for name in TOLERANCES])
def test_an_example_scores_under_mpirun_as_in_plain_keras(corpus, name):
    metric, tolerance = TOLERANCES[name]
    plain = corpus["plain"][(name, 0)]
    assert plain["error"] is None and plain["metric"] == metric, plain
    ranks = [corpus["mpirun"].get((name, rank)) for rank in range(3)]
    errors = {rank: report and report["error"] for rank, report in enumerate(ranks)}
    assert all(report is not None and report["error"] is None for report in ranks), errors
    values = [report["value"] for report in ranks]
    assert all(report["metric"] == metric for report in ranks), ranks
    assert values == pytest.approx([values[0]] * 3, rel=1e-5), values  # the same model on every rank
    assert abs(values[0] - plain["value"]) <= tolerance, (name, plain["value"], values[0])


def test_a_ported_example_run_as_one_process_is_plain_keras(corpus):
    # the ported script, without mpirun, scores exactly as the plain Keras script it was ported from
    name = PORTED_IN_ONE_PROCESS
    ported, plain = corpus["plain"][("ported", name)], corpus["plain"][(name, 0)]
    assert ported["error"] is None, ported["error"]
    assert ported["value"] == pytest.approx(plain["value"], rel=1e-6), (ported, plain)
