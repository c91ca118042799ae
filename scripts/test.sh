#!/usr/bin/env bash
# The whole test suite: install into .venv (with the test extras and JAX, whose multi-process test
# runs here), lint, type-check, then pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh" test,jax
cd "$ROOT"
"$ROOT/.venv/bin/ruff" check mpi_trainer tests scripts benchmarks
"$ROOT/.venv/bin/mypy"  # the package, under the settings in setup.cfg [mypy]
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
