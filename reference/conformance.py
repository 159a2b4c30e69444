"""The conformance report: per-rule status from per-test outcomes (schema `loader-conformance/1`).

Rule status, from the outcomes of the tests that name the rule:
  failed   any of them failed or errored (an unexpected pass of an expected failure counts);
  xfailed  none failed and at least one failed as the adopter expected;
  passed   none failed, at least one passed, the rest skipped;
  skipped  all were skipped (the report keeps the first reason);
  untested no test names the rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from reference.rules import BY_ID, RULES, get

SCHEMA = "loader-conformance/1"
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


def rule_statuses(outcomes: Iterable[TestOutcome]) -> dict[str, dict[str, Any]]:
    """Status of every catalogue rule from test outcomes.

    Raises:
        KeyError: when an outcome names a rule the catalogue lacks.
    """
    by_rule: dict[str, list[TestOutcome]] = {rule.id: [] for rule in RULES}
    for outcome in outcomes:
        for rule_id in outcome.rules:
            by_rule[get(rule_id).id].append(outcome)
    statuses: dict[str, dict[str, Any]] = {}
    for rule_id, tests in by_rule.items():
        if not tests:
            statuses[rule_id] = {"status": "untested", "tests": []}
            continue
        seen = {t.outcome for t in tests}
        status = next(o for o in _PRECEDENCE if o in seen)
        entry: dict[str, Any] = {"status": status, "tests": sorted(t.nodeid for t in tests)}
        if status in ("skipped", "xfailed", "failed"):
            reasons = [t.reason for t in tests if t.outcome == status and t.reason]
            if reasons:
                entry["reason"] = reasons[0]
        statuses[rule_id] = entry
    return statuses


def build_report(
    *,
    loader_name: str,
    loader_source: str,
    capabilities: Iterable[str],
    device: str,
    outcomes: Iterable[TestOutcome],
) -> dict[str, Any]:
    """The JSON-ready report of one run."""
    return {
        "schema": SCHEMA,
        "loader": {
            "name": loader_name,
            "source": loader_source,
            "capabilities": sorted(capabilities),
        },
        "device": device,
        "rules": rule_statuses(outcomes),
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
    return lines


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
