#!/usr/bin/env bash
# Proves the GPU tier's package list (README, "GPU tier"): a venv holding only torch,
# safetensors, numpy, pytest and pytest-mock runs the CPU tier's tests and collects the GPU
# tier's, with the repository on the path and the package not installed, as `tox -e gpu` does.
# Optional packages (hypothesis, diffusers, tqdm, matplotlib) are skipped with a reason or
# imported only by the command that needs them.
#
#   .ci/bare-venv.sh [VENV]   # VENV: where to make the venv (a new folder); default a temporary one
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-$(mktemp -d)/bare}"
python3 -m venv "$venv"
# PIP_CONSTRAINT (set by .ci/run) keeps torch on its CPU build here too.
"$venv/bin/python" -m pip install --quiet torch safetensors numpy pytest pytest-mock
"$venv/bin/python" -m pip list --format=freeze | grep -iE '^(torch|safetensors|numpy|pytest|pytest-mock|tqdm|hypothesis|diffusers)=' || true
export CUDA_VISIBLE_DEVICES=
# Two processes, every other test file each (the bare venv has no pytest-xdist): the machine's
# two cores, a bit more than half the wall time of one.
logs="$(mktemp -d)"
files=(tests/unit/test_*.py)
halves=("" "")
for i in "${!files[@]}"; do halves[i % 2]+="${files[i]} "; done
pids=()
for half in 0 1; do
    # shellcheck disable=SC2086 # the file names hold no spaces
    "$venv/bin/python" -m pytest ${halves[half]} --loader=reference --runtime-device=cpu -q \
        -p no:cacheprovider -m "not selftest and not long" -rs >"$logs/half-$half.log" 2>&1 &
    pids+=($!)
done
status=0
for half in 0 1; do
    wait "${pids[half]}" || status=1
    cat "$logs/half-$half.log"
done
[ "$status" -eq 0 ]
"$venv/bin/python" -m pytest tests/gpu --collect-only -q -p no:cacheprovider --runtime-device=cpu --loader=reference
