#!/usr/bin/env bash
# Proves the GPU tier's package list (README, "GPU tier"): a venv holding only torch,
# safetensors, numpy, pytest and pytest-mock runs the CPU tier's tests and collects the GPU
# tier's, with the repository on the path and the package not installed, as `tox -e gpu` does.
# Optional packages (hypothesis, diffusers, tqdm, matplotlib) are skipped with a reason or
# imported only by the command that needs them.
#
#   .ci/bare-venv.sh [--install-only] [VENV]
#     VENV: the venv to use (made where missing); default a new temporary one.
#     --install-only: make VENV and install its packages, run nothing (.ci/run does it while
#     tox installs the unit tier's environment: two installs, mostly one core each, at once).
set -euo pipefail
cd "$(dirname "$0")/.."
install_only=false
if [ "${1:-}" = "--install-only" ]; then install_only=true; shift; fi
venv="${1:-$(mktemp -d)/bare}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# PIP_CONSTRAINT (set by .ci/run) keeps torch on its CPU build here too. In a venv that has
# them, this only checks.
"$venv/bin/python" -m pip install --quiet torch safetensors numpy pytest pytest-mock
if "$install_only"; then exit 0; fi
"$venv/bin/python" -m pip list --format=freeze | grep -iE '^(torch|safetensors|numpy|pytest|pytest-mock|tqdm|hypothesis|diffusers)=' || true
export CUDA_VISIBLE_DEVICES=
# Two processes, every other test each (.ci/shard.py; the bare venv has no pytest-xdist), one
# torch thread each: two processes of torch's default two threads on two cores took 49 s each,
# of one thread 43 s (2026-12-07).
logs="$(mktemp -d)"
pids=()
for half in 0 1; do
    OMP_NUM_THREADS=1 PYTHONPATH=.ci "$venv/bin/python" -m pytest tests/unit -p shard --shard="$half/2" \
        --loader=reference --runtime-device=cpu -q -p no:cacheprovider \
        -m "not selftest and not long" -rs >"$logs/half-$half.log" 2>&1 &
    pids+=($!)
done
status=0
for half in 0 1; do
    wait "${pids[half]}" || status=1
    cat "$logs/half-$half.log"
done
[ "$status" -eq 0 ]
"$venv/bin/python" -m pytest tests/gpu --collect-only -q -p no:cacheprovider --runtime-device=cpu --loader=reference
