#!/usr/bin/env bash
# The whole test suite: install into .venv (with the test extras and JAX, whose multi-process test
# runs here), lint, type-check, then pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test,jax
cd "$ROOT"
"$ROOT/.venv/bin/ruff" check mpi_trainer tests scripts benchmarks
"$ROOT/.venv/bin/mypy"  # the package, under the settings in setup.cfg [mypy]
# One test process per core, at most 4 (each holds a TensorFlow), each taking whole files: a file's
# module fixtures (the examples' corpus and its two jobs) run once. Arguments given later win: -n 0
# runs everything in this process.
exec "$ROOT/.venv/bin/python" -m pytest -q --numprocesses auto --maxprocesses 4 --dist loadfile "$@"
