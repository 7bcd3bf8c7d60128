#!/usr/bin/env bash
# Issue 38's GPU check: install the project with its Triton extra (offline: what is already installed, no build isolation), then run scripts/gpu_check.py with the given args ($PYTHON: the interpreter, default python3).
cd "$(dirname "$0")/.." && P="${PYTHON:-python3}" && { "$P" -m pip install -q -e ".[triton]" || "$P" -m pip install -q --no-build-isolation --no-deps -e . || echo "gpu_check.sh: pip install failed; running from the source tree"; } && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" exec "$P" scripts/gpu_check.py "$@"
