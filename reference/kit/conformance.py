"""The conformance report: per-rule status from per-test outcomes (schema `loader-conformance/1`).

Rule status, from the outcomes of the tests that name the rule:
  failed   any of them failed or errored; or the adopter expected the rule to fail, none of its
           tests failed and at least one passed (an unexpected pass, reason `XPASS(strict): ...`);
  xfailed  none failed and at least one failed as the adopter expected;
  passed   none failed, at least one passed, the rest skipped;
  skipped  all were skipped (the report keeps the first reason);
  untested no test names the rule.
Rules the adopter expects to fail carry their reason under `expected` (see
reference.kit.expectations). A failed rule lists every failing test with its one-line reason
under `failures` (rule first, the case, what was expected and what the loader did).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from reference.rules import BY_ID, RULES, get

__all__ = [
    "SCHEMA",
    "XPASS",
    "Outcome",
    "TestOutcome",
    "build_report",
    "marker_problems",
    "rule_statuses",
    "summary_lines",
    "unexpected_passes",
    "verdict",
]

SCHEMA = "loader-conformance/1"
XPASS = "XPASS(strict)"
Outcome = Literal["passed", "failed", "skipped", "xfailed"]
_PRECEDENCE: tuple[Outcome, ...] = ("failed", "xfailed", "passed", "skipped")


@dataclass(frozen=True)
class TestOutcome:
    """The final outcome of one test, with the rules it names."""

    __test__ = False  # a value, not a test class for pytest to collect

    nodeid: str
    rules: tuple[str, ...]
    outcome: Outcome
    reason: str = ""


def rule_statuses(
    outcomes: Iterable[TestOutcome], expected: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Status of every catalogue rule from test outcomes.

    Args:
        outcomes: the final outcome of each test.
        expected: rule IDs the adopter expects to fail on this device, with reasons.

    Raises:
        KeyError: when an outcome or `expected` names a rule the catalogue lacks.
    """
    expected = dict(expected or {})
    for rule_id in expected:
        get(rule_id)
    by_rule: dict[str, list[TestOutcome]] = {rule.id: [] for rule in RULES}
    for outcome in outcomes:
        for rule_id in outcome.rules:
            by_rule[get(rule_id).id].append(outcome)
    statuses: dict[str, dict[str, Any]] = {}
    for rule_id, tests in by_rule.items():
        entry: dict[str, Any] = {"status": "untested", "tests": sorted(t.nodeid for t in tests)}
        if tests:
            seen = {t.outcome for t in tests}
            entry["status"] = next(o for o in _PRECEDENCE if o in seen)
            if entry["status"] in ("skipped", "xfailed", "failed"):
                reasons = [t.reason for t in tests if t.outcome == entry["status"] and t.reason]
                if reasons:
                    entry["reason"] = reasons[0]
            if entry["status"] == "failed":
                entry["failures"] = [
                    {"test": t.nodeid, "reason": t.reason}
                    for t in sorted(tests, key=lambda t: t.nodeid)
                    if t.outcome == "failed"
                ]
        if rule_id in expected:
            entry["expected"] = expected[rule_id]
            if entry["status"] == "passed":
                entry["status"] = "failed"
                entry["reason"] = (
                    f"{XPASS}: expected to fail ({expected[rule_id]}) but no test of it failed;"
                    " remove it from the expectations"
                )
        statuses[rule_id] = entry
    return statuses


def unexpected_passes(report: Mapping[str, Any]) -> list[str]:
    """IDs of the rules expected to fail that passed instead (each fails the run)."""
    return [
        rule_id
        for rule_id, entry in report["rules"].items()
        if entry["status"] == "failed" and str(entry.get("reason", "")).startswith(XPASS)
    ]


def build_report(
    *,
    loader_name: str,
    loader_source: str,
    capabilities: Iterable[str],
    device: str,
    outcomes: Iterable[TestOutcome],
    expected: Mapping[str, str] | None = None,
    expectations_source: str | None = None,
) -> dict[str, Any]:
    """The JSON-ready report of one run.

    Args:
        loader_name: the adapter's name.
        loader_source: how the adapter was chosen.
        capabilities: the capabilities it declares.
        device: the runtime device of the run.
        outcomes: the final outcome of each test.
        expected: rules expected to fail on this device, with reasons (see rule_statuses).
        expectations_source: the expectations file they came from, if any.
    """
    return {
        "schema": SCHEMA,
        "loader": {
            "name": loader_name,
            "source": loader_source,
            "capabilities": sorted(capabilities),
        },
        "device": device,
        "expectations": {"source": expectations_source, "rules": dict(expected or {})},
        "rules": rule_statuses(outcomes, expected),
    }


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """A compact per-section summary: one line per section, rule numbers grouped by status."""
    rules: Mapping[str, Mapping[str, Any]] = report["rules"]
    totals: dict[str, int] = {}
    sections: dict[str, dict[str, list[str]]] = {}
    for rule_id, entry in rules.items():
        status = entry["status"]
        totals[status] = totals.get(status, 0) + 1
        section, number = rule_id.split("-", 1)
        sections.setdefault(section, {}).setdefault(status, []).append(number)
    lines = [
        f"conformance of {report['loader']['name']} on {report['device']}: "
        + ", ".join(f"{n} {s}" for s, n in sorted(totals.items()))
    ]
    for section, groups in sections.items():
        parts = [f"{status} {','.join(numbers)}" for status, numbers in sorted(groups.items())]
        lines.append(f"  {section:<5} " + "; ".join(parts))
    lines.extend(f"  {r}: {report['rules'][r]['reason']}" for r in unexpected_passes(report))
    lines.append(verdict(report))
    return lines


def verdict(report: Mapping[str, Any]) -> str:
    """One line judging a loader on one device from its report.

    MUST rules that failed or were expected to fail (`xfailed`) both count against it: an
    expectation keeps a known defect from failing the adopter's run, not from the verdict.
    """
    label = f"{report['loader']['name']}@{report['device']}"
    statuses: dict[str, str] = {r: e["status"] for r, e in report["rules"].items()}

    def having(level: str, *wanted: str) -> list[str]:
        return [
            r for r, s in statuses.items() if s in wanted and r in BY_ID and BY_ID[r].level == level
        ]

    failing = having("MUST", "failed", "xfailed")
    if failing:
        known = having("MUST", "xfailed")
        plural = "s" if len(failing) > 1 else ""
        line = f"{label}: fails {len(failing)} MUST rule{plural}: {', '.join(failing)}"
        return line + (f" ({len(known)} expected: {', '.join(known)})" if known else "")
    counts = {s: sum(1 for v in statuses.values() if v == s) for s in ("passed", "skipped")}
    if not having("MUST", "passed") and not having("SHOULD", "passed", "failed", "xfailed"):
        return f"{label}: nothing judged: no rule passed or failed"
    untested = sum(1 for v in statuses.values() if v == "untested")
    line = (
        f"{label}: conforms to all MUST rules of its declared capabilities that the suite tests "
        f"({counts['passed']} passed, {counts['skipped']} skipped, {untested} untested)"
    )
    declined = having("SHOULD", "failed", "xfailed")
    return line + (f"; declines SHOULD rules: {', '.join(declined)}" if declined else "")


def marker_problems(tests: Mapping[str, tuple[tuple[str, ...], bool]]) -> list[str]:
    """What is wrong with the rule markers of a suite.

    Args:
        tests: per test node id, (rule IDs it names, whether it is marked internal).

    Returns:
        One line per test that names an unknown rule, names none without being internal, or is
        internal while naming rules. Empty when all is well.
    """
    problems: list[str] = []
    for nodeid, (rule_ids, internal) in sorted(tests.items()):
        unknown = [r for r in rule_ids if r not in BY_ID]
        if unknown:
            problems.append(f"{nodeid}: unknown rule(s) {', '.join(unknown)}")
        elif internal and rule_ids:
            problems.append(f"{nodeid}: marked internal but names {', '.join(rule_ids)}")
        elif not internal and not rule_ids:
            problems.append(
                f"{nodeid}: names no rule; add @pytest.mark.rule('ID') or @pytest.mark.internal"
            )
    return problems
