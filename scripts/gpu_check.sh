#!/usr/bin/env bash
# Issue 38's GPU check in one line: install the project with its Triton extra, then run scripts/gpu_check.py with the given args.
set -euo pipefail; cd "$(dirname "$0")/.." && python -m pip install -q -e ".[triton]" && exec python scripts/gpu_check.py "$@"
