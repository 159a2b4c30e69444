"""Command line: `python -m reference demo | rules | report`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from reference.matrix import report_command
from reference.plan import WeightLoadPlan, resolve_checkpoint_load_device
from reference.quantization import QuantizationSpec, requires_device_weight_processing
from reference.rules import RULES


def _plan_row(name: str, plan: WeightLoadPlan) -> str:
    post = str(plan.weight_postprocess_device) if plan.weight_postprocess_device else "-"
    return (
        f"{name:<24} {plan.checkpoint_load_device!s:<8} {post:<8} "
        f"{'yes' if plan.defer_cpu_offload else 'no':<6} "
        f"{'yes' if plan.load_full_state_dict_on_device else 'no'}"
    )


def demo() -> int:
    """Print the plans of a small pipeline under each loading mode."""
    runtime = torch.device("cuda", 0)
    cases: list[tuple[str, bool, QuantizationSpec | None]] = [
        ("transformer resident", False, None),
        ("transformer offloaded", True, None),
        ("transformer fp8 offload", True, QuantizationSpec("fp8")),
        ("vae resident", False, None),
    ]
    print(f"{'component / mode':<24} {'load':<8} {'post':<8} {'defer':<6} direct")
    for name, offload, quant in cases:
        plan = WeightLoadPlan.for_component(
            checkpoint_load_device=resolve_checkpoint_load_device(
                runtime, component_cpu_offload=offload, quantization=quant
            ),
            needs_device_weight_postprocess=requires_device_weight_processing(quant),
            component_cpu_offload=offload,
        )
        print(_plan_row(name, plan))
    return 0


def rules() -> int:
    """Print the rule catalogue."""
    for rule in RULES:
        print(f"{rule.id:<7} {rule.level:<6} {rule.origin:<8} {rule.title}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="load a small demo pipeline in each mode and print the tables")
    sub.add_parser("rules", help="print the rule catalogue")
    merge = sub.add_parser("report", help="merge conformance reports into one Markdown matrix")
    merge.add_argument("reports", nargs="+", metavar="REPORT.json")
    merge.add_argument("--out", metavar="FILE", help="write the matrix to FILE, not stdout")
    args = parser.parse_args(argv)
    if args.command == "report":
        return report_command(args.reports, out=args.out)
    return {"demo": demo, "rules": rules}[args.command]()


if __name__ == "__main__":
    sys.exit(main())
