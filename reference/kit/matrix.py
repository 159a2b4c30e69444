"""Merge conformance reports into one Markdown matrix: `python -m reference report A.json ...`.

Rows are the rules of the catalogue (ID, level, title), columns are `loader@device`, one per
report; a verdict line per column follows the table.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reference.kit.conformance import SCHEMA, verdict
from reference.kit.errors import KitError
from reference.rules import BY_ID, RULES

__all__ = [
    "CELLS",
    "LEGEND",
    "ReportError",
    "column",
    "load_report",
    "render_matrix",
    "report_command",
]

CELLS: dict[str, str] = {
    "passed": "pass",
    "failed": "**FAIL**",
    "xfailed": "xfail",
    "skipped": "skip",
    "untested": "-",
}
LEGEND = (
    "pass: every test of the rule passed (some may be skipped); **FAIL**: a test failed, or a rule"
    " expected to fail passed; xfail: fails as the adopter declared; skip: the loader does not"
    " declare the capability; -: no test pins the rule yet; n/a: absent from that report."
)


class ReportError(KitError, ValueError):
    """A file is not a conformance report this version can read, or two reports collide."""


def load_report(path: str | Path) -> dict[str, Any]:
    """Read one JSON report and check its schema.

    Raises:
        ReportError: naming the file when it cannot be read, is not JSON, or has another schema.
    """
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ReportError(f"{path}: cannot read a JSON report: {error}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA:
        found = report.get("schema") if isinstance(report, dict) else type(report).__name__
        raise ReportError(f"{path}: schema is {found!r}, expected {SCHEMA!r}")
    return report


def column(report: Mapping[str, Any]) -> str:
    """The column label of a report: `loader@device`."""
    return f"{report['loader']['name']}@{report['device']}"


def render_matrix(reports: Sequence[Mapping[str, Any]], *, origins: Sequence[str] = ()) -> str:
    """The Markdown matrix of several reports.

    Args:
        reports: reports of schema loader-conformance/1, in column order.
        origins: where each report came from (file names), for the collision message.

    Raises:
        ReportError: no report given, or two reports for one `loader@device`.
    """
    if not reports:
        raise ReportError("no report to merge")
    labels = [column(r) for r in reports]
    names = list(origins) or [f"report {i + 1}" for i in range(len(reports))]
    for i, label in enumerate(labels):
        if label in labels[:i]:
            first = names[labels.index(label)]
            raise ReportError(f"{first} and {names[i]} are both reports of {label}")
    catalogue = [rule.id for rule in RULES]
    extra = sorted({r for rep in reports for r in rep["rules"] if r not in BY_ID})
    lines = [
        "| rule | level | title | " + " | ".join(labels) + " |",
        "| --- | --- | --- | " + " | ".join("---" for _ in labels) + " |",
    ]
    for rule_id in catalogue + extra:
        rule = BY_ID.get(rule_id)
        level, title = (rule.level, rule.title) if rule else ("?", "(not in this catalogue)")
        cells = [_cell(rep["rules"].get(rule_id)) for rep in reports]
        lines.append(f"| {rule_id} | {level} | {title} | " + " | ".join(cells) + " |")
    lines += ["", LEGEND, "", "Loaders:", ""]
    for rep in reports:
        capabilities = ", ".join(rep["loader"].get("capabilities", [])) or "none"
        lines.append(
            f"- `{column(rep)}`: {rep['loader'].get('source', 'source unknown')}; "
            f"capabilities: {capabilities}"
        )
    lines += ["", "Verdicts:", ""]
    lines += [f"- {verdict(rep)}" for rep in reports]
    return "\n".join(lines) + "\n"


def _cell(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "n/a"
    return CELLS.get(str(entry["status"]), str(entry["status"]))


def report_command(paths: Sequence[str], *, out: str | None) -> int:
    """`python -m reference report`: print the matrix of `paths`, or write it to `out`.

    Returns:
        0 on success; 2 with a message on stderr when a report cannot be read or merged.
    """
    try:
        text = render_matrix([load_report(p) for p in paths], origins=paths)
    except ReportError as error:
        print(f"report: {error}", file=sys.stderr)
        return 2
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text, encoding="utf-8")
        print(f"matrix of {len(paths)} report(s) written to {out}")
    return 0
