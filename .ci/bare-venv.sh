#!/usr/bin/env bash
# Proves the GPU tier's package list (README, "GPU tier"): a venv holding only torch,
# safetensors, numpy, pytest and pytest-mock runs the CPU tier's tests and collects the GPU
# tier's, with the repository on the path and the package not installed, as `tox -e gpu` does.
# Optional packages (hypothesis, diffusers, tqdm, matplotlib) are skipped with a reason or
# imported only by the command that needs them.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/bare"
python3 -m venv "$venv"
# PIP_CONSTRAINT (set by .ci/run) keeps torch on its CPU build here too.
"$venv/bin/python" -m pip install --quiet torch safetensors numpy pytest pytest-mock
"$venv/bin/python" -m pip list --format=freeze | grep -iE '^(torch|safetensors|numpy|pytest|pytest-mock|tqdm|hypothesis|diffusers)=' || true
export CUDA_VISIBLE_DEVICES=
"$venv/bin/python" -m pytest tests/unit --loader=reference --runtime-device=cpu -q -p no:cacheprovider \
    -m "not selftest and not long" -rs
"$venv/bin/python" -m pytest tests/gpu --collect-only -q -p no:cacheprovider --runtime-device=cpu --loader=reference
