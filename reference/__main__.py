"""Command line: `python -m reference demo | load | bench | rules | report | conform`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from reference.kit.matrix import report_command
from reference.programs.cli import load_command
from reference.programs.demo import demo
from reference.rules import RULES

__all__ = ["main", "rules"]


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
    # These three parse their own arguments (load's flags, bench's, pytest's): argparse hands
    # them everything after the command word, --help included.
    passed_on = {
        "load": "load a pipeline folder: python -m reference load DIR [flags]",
        "bench": "peak memory and time of every loading path (bench --help)",
        "conform": "run the installed contract tests: conform --loader=SPEC [pytest args] (-h)",
    }
    for name, what in passed_on.items():
        sub.add_parser(name, help=what, add_help=False, prefix_chars="\0")
    sub.add_parser("rules", help="print the rule catalogue")
    merge = sub.add_parser("report", help="merge conformance reports into one Markdown matrix")
    merge.add_argument("reports", nargs="+", metavar="REPORT.json")
    merge.add_argument("--out", metavar="FILE", help="write the matrix to FILE, not stdout")
    argv = list(sys.argv[1:] if argv is None else argv)
    args, rest = parser.parse_known_args(argv)
    if args.command not in passed_on and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "load":
        return load_command(rest)
    if args.command == "conform":
        from reference.kit.conform import conform_command

        return conform_command(rest)
    if args.command == "bench":
        from reference.programs.bench.command import bench_command

        return bench_command(rest)
    if args.command == "report":
        return report_command(args.reports, out=args.out)
    if args.command == "demo":
        return demo(keep=args.keep)
    return rules()


if __name__ == "__main__":
    sys.exit(main())
