#!/usr/bin/env bash
# Proves the kit installs and runs with no clone (README, "Your loader in your own CI"): the
# built wheel, installed with its test extra into a fresh venv outside the repository, runs
# `python -m reference conform` against the plain-assign baseline from an empty folder. The run
# must fail (the baseline breaks MUST rules), write a report that judged rules, and hold each
# contract test once.
#
#   .ci/wheel-check.sh [VENV]   # VENV: a venv outside the clone to install the wheel into (.ci/run
#                               # hands it the one .ci/bare-venv.sh made: torch is in it already);
#                               # default a new one
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$root"
wheel="$(ls "$work"/dist/*.whl)"
shipped=$(python3 -m zipfile -l "$wheel" | grep -cE '^reference/kit/suite/test_[a-z0-9_]+\.py ')
in_repo=$(ls "$root"/tests/unit/test_*.py | wc -l)
echo "wheel $(basename "$wheel"): $shipped contract test files (tests/unit holds $in_repo)"
[ "$shipped" -eq "$in_repo" ]
# Two packages: the wheel installs `reference` and, beside it, `fakes` (the doubles the suite
# loads), and nothing else at the top of site-packages.
tops=$(python3 -m zipfile -l "$wheel" | awk 'NR > 1 {print $1}' | grep -v '\.dist-info/' | cut -d/ -f1 | sort -u | tr '\n' ' ')
echo "wheel top-level packages: $tops"
[ "$tops" = "fakes reference " ]
venv="${1:-$work/venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
# PIP_CONSTRAINT (set by .ci/run) keeps torch on its CPU build here too.
"$venv/bin/python" -m pip install --quiet "$wheel[test]"
mkdir "$work/elsewhere" && cd "$work/elsewhere"
# The package registers no pytest plugin: an unrelated pytest run imports neither torch nor it.
"$venv/bin/python" -c "import fakes, reference; print('import fakes, reference: from', fakes.__file__.rsplit('/', 3)[-3])"
"$venv/bin/python" -X importtime -m pytest --version 2>importtime.log >/dev/null
if grep -qE '\| +(torch|reference)(\.|$)' importtime.log; then
    echo "pytest --version imported torch or reference:"; grep -E '\| +(torch|reference)(\.|$)' importtime.log | head -n 3
    exit 1
fi
echo "pytest --version in the kit's venv: $(wc -l <importtime.log) modules imported, neither torch nor reference"
export CUDA_VISIBLE_DEVICES=
code=0
# The installed kit judged, not at length: the hostile corpus and the blocking files, whose
# attempts against this baseline each wait out a deadline, are left to tox -e matrix.
# One torch thread per xdist worker (tox.ini says why).
OMP_NUM_THREADS=1 "$venv/bin/python" -m reference conform \
    --loader=reference.kit.adapters.baselines:PlainAssign \
    --conformance-report=r.json -n auto -q --no-header -k "not hostile and not blocking" \
    >conform.log 2>&1 || code=$?
tail -n 3 conform.log
[ "$code" -eq 1 ] || { echo "conform exited $code; expected 1 (plain-assign breaks MUST rules)"; exit 1; }
"$venv/bin/python" - <<'PY'
import json

report = json.load(open("r.json"))
statuses = [entry["status"] for entry in report["rules"].values()]
assert report["loader"]["name"] == "plain-assign", report["loader"]
assert statuses.count("failed") and statuses.count("passed"), statuses
print(f"r.json: {statuses.count('passed')} rules passed, {statuses.count('failed')} failed")
PY
