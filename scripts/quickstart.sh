#!/usr/bin/env bash
# Quick start: install into .venv, then train an MLP on scikit-learn's bundled digits with
# one scheduler and two workers (mpirun -n 3). Needs only Python >= 3.10 and the package index.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
RANKS="${RANKS:-3}"
ROOT_FLAG=()
[ "$(id -u)" = "0" ] && ROOT_FLAG=(--allow-run-as-root)
exec "$ROOT/.venv/bin/mpirun" -n "$RANKS" --oversubscribe --bind-to none "${ROOT_FLAG[@]}" \
  "$ROOT/.venv/bin/python" -m mpi_trainer train configs/quickstart.toml "$@"
