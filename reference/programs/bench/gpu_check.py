"""The summary at the end of `.ci/gpu-check.sh`: one JSON file and one verdict line per target.

    python -m reference.programs.bench.gpu_check --steps STEPS.tsv --out SUMMARY.json
                                                 [--bench BENCH.json] [--table TABLE.txt] [--dry]

STEPS.tsv holds a line per step the script ran: name, status (passed, failed, timed out or
skipped), seconds and a detail, tab-separated. BENCH.json is what `python -m reference bench
--gpu --json` wrote, when it ran. Prints a line per step, where the summary and the table are,
then a line per target of `reference.programs.bench.gpu_ratios.GPU_RATIOS`: met, missed, or not
measured with the reason (all of them "not measured" in a dry run, their status "skipped").
Exits 1 when a step failed or timed out, else 0: a missed target is reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reference.programs.bench.gpu_ratios import GPU_RATIOS, verdict
from reference.request.platform import describe

__all__ = ["SCHEMA", "STEP_STATUSES", "main", "read_steps", "summarise", "targets"]

SCHEMA = "reference-gpu-check/1"
STEP_STATUSES = ("passed", "failed", "timed out", "skipped")


def read_steps(path: Path) -> list[dict[str, Any]]:
    """The steps of a STEPS.tsv (see the module's docstring).

    Raises:
        ValueError: a line without its four fields, or with an unknown status.
    """
    steps = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4 or fields[1] not in STEP_STATUSES:
            raise ValueError(f"{path}: a step line is name, status, seconds, detail: {line!r}")
        name, status, seconds, detail = fields
        steps.append({"name": name, "status": status, "seconds": float(seconds), "detail": detail})
    return steps


def targets(ratios: Mapping[str, Mapping[str, Any]] | None, why_not: str) -> dict[str, Any]:
    """Every target's ratio as the bench computed it, or, for a bench that did not run, each
    target skipped with `why_not`."""
    out: dict[str, Any] = {}
    for ratio in GPU_RATIOS:
        if not ratio.op:
            continue
        figures = dict((ratios or {}).get(ratio.name) or {})
        if not figures:
            figures = {"value": None, "target": None, "op": ratio.op, "pass": None}
            figures |= {"status": "skipped", "reason": why_not}
        out[ratio.name] = figures
    return out


def _written(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def summarise(
    steps: Sequence[Mapping[str, Any]],
    *,
    dry: bool,
    bench: Path | None,
    table: Path | None,
) -> dict[str, Any]:
    """The summary document: the platform, the steps, where the bench's files are, the targets."""
    ratios = None
    if bench is not None and bench.is_file():
        ratios = json.loads(bench.read_text()).get("ratios")
    why_not = (
        "dry run: no CUDA step ran" if dry else "the GPU bench did not finish (its step says why)"
    )
    return {
        "schema": SCHEMA,
        "dry": dry,
        "platform": describe(),
        "steps": list(steps),
        "bench_json": str(bench) if ratios is not None else None,
        "table": str(table) if table is not None and _written(table) else None,
        "targets": targets(ratios, why_not),
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference.programs.bench.gpu_check")
    parser.add_argument("--steps", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--bench", type=Path)
    parser.add_argument("--table", type=Path)
    parser.add_argument("--dry", action="store_true")
    args = parser.parse_args(argv)
    steps = read_steps(args.steps)
    summary = summarise(steps, dry=args.dry, bench=args.bench, table=args.table)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    for step in steps:
        detail = f": {step['detail']}" if step["detail"] else ""
        print(f"step {step['name']}: {step['status']} ({step['seconds']:.0f} s){detail}")
    print(f"summary: {args.out}")
    print(f"table: {summary['table'] or 'none (the GPU bench did not run)'}")
    for name, ratio in summary["targets"].items():
        print(verdict(name, ratio))
    return 1 if any(s["status"] in ("failed", "timed out") for s in steps) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
