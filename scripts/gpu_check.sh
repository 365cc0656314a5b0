#!/usr/bin/env bash
# The short GPU check (bench/gpu_check.py) on a GPU machine lent for a few minutes, run from the repository root: no
# Ray, no install of the project, well under 5 minutes. It needs torch, transformers and safetensors there; what the
# machine lacks travels as wheels in .whl/ (ignored by git), fetched here for its Python (3.12 on the lent machines):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types typing-inspection
# The JSON goes to $OUT (the device tool's folder) or bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# The CPU half of the equality check runs the torch path too, rather than compiling the CPU kernels there.
export PYTHONUNBUFFERED=1 DSPARK_KERNELS=torch
exec $PY bench/gpu_check.py --out "${OUT:-bench/results}" "$@"
