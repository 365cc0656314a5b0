#!/usr/bin/env bash
# Fresh machine -> test results: set up .venv with the test extras, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export RAY_AUTH_MODE=disabled
exec .venv/bin/python -m pytest -q "$@"
