"""Command line: `python -m reference demo | load | bench | rules | report | conform`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from reference.cli import load_command
from reference.demo import demo
from reference.kit.matrix import report_command
from reference.rules import RULES


def rules() -> int:
    """Print the rule catalogue."""
    for rule in RULES:
        print(f"{rule.id:<7} {rule.level:<6} {rule.origin:<8} {rule.title}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser(
        "demo", help="load a small demo pipeline in each mode and print the tables"
    )
    demo_parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="write the demo's pipelines into DIR and keep them (default: a temporary folder)",
    )
    sub.add_parser("load", help="load a pipeline folder: python -m reference load DIR [flags]")
    sub.add_parser("bench", help="peak memory and time of every loading path (bench --help)")
    sub.add_parser("rules", help="print the rule catalogue")
    sub.add_parser(
        "conform",
        help="run the installed contract tests: conform --loader=SPEC [pytest args] (conform -h)",
    )
    merge = sub.add_parser("report", help="merge conformance reports into one Markdown matrix")
    merge.add_argument("reports", nargs="+", metavar="REPORT.json")
    merge.add_argument("--out", metavar="FILE", help="write the matrix to FILE, not stdout")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["load"]:
        return load_command(argv[1:])  # its flags are parsed by reference.args
    if argv[:1] == ["conform"]:
        from reference.kit.conform import conform_command

        return conform_command(argv[1:])  # its arguments are pytest's
    if argv[:1] == ["bench"]:
        from reference.bench.command import bench_command

        return bench_command(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "report":
        return report_command(args.reports, out=args.out)
    if args.command == "demo":
        return demo(keep=args.keep)
    return rules()


if __name__ == "__main__":
    sys.exit(main())
