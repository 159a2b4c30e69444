#!/usr/bin/env bash
# The GPU story in one run, on a CUDA machine with torch, safetensors, numpy, pytest and
# pytest-mock preinstalled (no network needed; diffusers, pytest-xdist and the [peers] extra
# are used where installed):
#   packages  the packages check and the platform line
#   gpu-tier  tests/gpu with runtime device cuda: what only a real device shows
#   unit-cuda tests/unit with runtime device cuda (what `tox -e gpu` reruns), across workers
#             (pytest-xdist's -n auto where installed, else serial)
#   bench     python -m reference bench --gpu --json: the GPU table and its ratios
# then one JSON summary ($GPU_CHECK_OUT/gpu-check.json; the table beside it, bench-gpu.txt),
# ending with one verdict line per target: met, missed or not measured.
#
# Time limit: $GPU_CHECK_TIMEOUT seconds for the whole run (default 480, so one short session
# on a lent GPU runs it whole and still has time to rerun): gpu-tier gets a fifth of it,
# unit-cuda three tenths, bench what is left; a step past its share is stopped with SIGINT
# (pytest still prints its summary and the figures) and marked "timed out".
#
# Dry mode (GPU_CHECK_DRY=1 or --dry), for a CPU machine: the CUDA steps are reported skipped,
# the rest runs (the packages check; `bench --gpu` with CUDA hidden must refuse in one line and
# exit 2; the summary and its verdict lines, every target "not measured"), in seconds.
#
# $GPU_CHECK_PYTHON names the interpreter (default python3); extra arguments go to both pytest
# steps. Exits 1 when a step failed or timed out, else 0 (a missed target is reported, not failed).
set -uo pipefail  # no -e: a failed step is recorded, and the summary still runs
cd "$(dirname "$0")/.."
dry="${GPU_CHECK_DRY:-0}"
if [[ "${1:-}" == "--dry" ]]; then
    dry=1
    shift
fi
py="${GPU_CHECK_PYTHON:-python3}"
out="${GPU_CHECK_OUT:-${TMPDIR:-/tmp}/gpu-check}"
total="${GPU_CHECK_TIMEOUT:-480}"
reserve=20  # seconds kept for the summary and a stopped step's last words
kill_after=10
mkdir -p "$out"
steps="$out/steps.tsv"
: >"$steps"
rm -f "$out/bench-gpu.json" "$out/bench-gpu.txt"
begin=$SECONDS

record() { # name status seconds detail
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$steps"
}

# The seconds a step may take: its share of the total, at most what is left.
limit_for() { # percent (0: all that is left)
    local left=$((total - (SECONDS - begin) - reserve - kill_after))
    local share=$((total * $1 / 100))
    if (($1 == 0 || share > left)); then share=$left; fi
    echo "$share"
}

run_step() { # name percent command...
    local name=$1 limit
    limit=$(limit_for "$2")
    shift 2
    if ((limit < 10)); then
        record "$name" skipped 0 "no time left of GPU_CHECK_TIMEOUT=$total"
        return
    fi
    echo "gpu-check: $name (at most ${limit} s)"
    local t0=$SECONDS rc
    timeout --signal=INT --kill-after="$kill_after" "$limit" "$@"
    rc=$?
    local status=passed
    if ((rc == 124 || rc == 137)); then
        status="timed out"
    elif ((rc != 0)); then
        status=failed
    fi
    record "$name" "$status" $((SECONDS - t0)) "exit $rc"
}

t0=$SECONDS
if "$py" - <<'PY'; then
import importlib.util, sys
missing = [m for m in ("torch", "safetensors", "numpy", "pytest", "pytest_mock")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu-check: missing Python packages: {', '.join(missing)} (numpy: safetensors"
             " needs it to write the test checkpoints); install them and rerun")
from reference.request.platform import describe
print("gpu-check:", describe())
PY
    record packages passed $((SECONDS - t0)) ""
else
    record packages failed $((SECONDS - t0)) "missing packages (see above)"
fi

if grep -q $'^packages\tfailed' "$steps"; then
    :
elif ((dry)); then
    record gpu-tier skipped 0 "dry run: needs CUDA"
    record unit-cuda skipped 0 "dry run: needs CUDA"
    t0=$SECONDS
    refusal=$(CUDA_VISIBLE_DEVICES= "$py" -m reference bench --gpu 2>&1 >/dev/null)
    rc=$?
    echo "$refusal"
    if ((rc == 2)) && [[ "$refusal" == *"needs CUDA"* ]] && (($(wc -l <<<"$refusal") == 1)); then
        record bench skipped $((SECONDS - t0)) "dry run: $refusal"
    else
        record bench failed $((SECONDS - t0)) "bench --gpu without CUDA exited $rc, not 2 with one line: $refusal"
    fi
else
    workers=() threads=()
    # With xdist, one torch thread per worker process (tox.ini says why).
    if "$py" -c "import xdist" 2>/dev/null; then workers=(-n auto) threads=(env OMP_NUM_THREADS=1); fi
    run_step gpu-tier 20 "$py" -m pytest tests/gpu --loader=reference --runtime-device=cuda \
        -m "not selftest and not long" -q -rs -p no:cacheprovider --durations=10 \
        --conformance-report="$out/conformance-gpu.json" "$@"
    run_step unit-cuda 30 "${threads[@]}" "$py" -m pytest tests/unit --loader=reference --runtime-device=cuda \
        -m "not selftest and not long" -q -rs -p no:cacheprovider --durations=10 "${workers[@]}" \
        --conformance-report="$out/conformance-cuda.json" "$@"
    run_step bench 0 bash -c '"$1" -m reference bench --gpu --json "$2/bench-gpu.json" | tee "$2/bench-gpu.txt"; exit "${PIPESTATUS[0]}"' \
        bench "$py" "$out"
fi

dry_flag=()
if ((dry)); then dry_flag=(--dry); fi
"$py" -m reference.programs.bench.gpu_check --steps "$steps" --out "$out/gpu-check.json" \
    --bench "$out/bench-gpu.json" --table "$out/bench-gpu.txt" "${dry_flag[@]}"
