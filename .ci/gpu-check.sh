#!/usr/bin/env bash
# The GPU tier without tox, on a CUDA machine with torch, safetensors, numpy, pytest and
# pytest-mock preinstalled (no network needed): the same command `tox -e gpu` runs.
# Prints the platform line, the tests, the conformance summary and the "gpu tier figures"
# (peak device memory, host memory growth). Time limit: $GPU_CHECK_TIMEOUT seconds (default 480,
# so one short session on a lent GPU runs it whole and still has time to rerun).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "safetensors", "numpy", "pytest", "pytest_mock")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu-check: missing Python packages: {', '.join(missing)} (numpy: safetensors"
             " needs it to write the test checkpoints); install them and rerun")
from reference.request.platform import describe
print("gpu-check:", describe())
PY
report="${TMPDIR:-/tmp}/conformance-cuda.json"
# SIGINT first: pytest stops like on Ctrl-C and still prints its summary and the figures.
timeout --signal=INT --kill-after=30 "${GPU_CHECK_TIMEOUT:-480}" \
    python3 -m pytest tests/unit tests/gpu --loader=reference --runtime-device=cuda -m "not selftest and not long" -q -rs \
    -p no:cacheprovider --durations=15 \
    --conformance-report="$report" "$@"
