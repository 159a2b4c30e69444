"""The suite's own machinery: rule markers, the catalogue, the conformance report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reference.kit.conformance import (
    SCHEMA,
    TestOutcome,
    build_report,
    marker_problems,
    rule_statuses,
    summary_lines,
)
from reference.rules import RULES, get

pytestmark = pytest.mark.internal

TESTS_ROOT = Path(__file__).resolve().parents[1]


def test_every_collected_test_names_known_rules(request: pytest.FixtureRequest) -> None:
    tests = {
        item.nodeid: (
            tuple(i for m in item.iter_markers("rule") for i in m.args),
            item.get_closest_marker("internal") is not None,
        )
        for item in request.session.items
        if Path(str(item.path)).resolve().is_relative_to(TESTS_ROOT)
    }
    assert tests, "no tests collected"
    assert marker_problems(tests) == []


def test_marker_problems_catch_unknown_missing_and_contradictory() -> None:
    problems = marker_problems(
        {
            "a": (("PLAN-1",), False),
            "b": (("NOPE-1",), False),
            "c": ((), False),
            "d": (("PLAN-2",), True),
            "e": ((), True),
        }
    )
    assert problems == [
        "b: unknown rule(s) NOPE-1",
        "c: names no rule; add @pytest.mark.rule('ID') or @pytest.mark.internal",
        "d: marked internal but names PLAN-2",
    ]


def test_catalogue_ids_are_unique_and_well_formed() -> None:
    ids = [rule.id for rule in RULES]
    assert len(ids) == len(set(ids)) == 86
    assert {rule.section for rule in RULES} == {
        "PLAN",
        "DEV",
        "ZC",
        "PREC",
        "DG",
        "FP8",
        "ARGS",
        "ADM",
        "PIPE",
        "VAE",
        "TE",
        "CKPT",
        "OUT",
    }
    assert all(rule.level in ("MUST", "SHOULD") and rule.title for rule in RULES)


def test_unknown_rule_lookup_says_what_ids_look_like() -> None:
    with pytest.raises(KeyError, match=r"unknown rule 'ZC-99'.*PLAN-1"):
        get("ZC-99")


def test_rule_status_precedence() -> None:
    outcomes = [
        TestOutcome("t1", ("PLAN-1",), "passed"),
        TestOutcome("t2", ("PLAN-1", "PLAN-2"), "failed", "call failed"),
        TestOutcome("t3", ("PLAN-3",), "skipped", "no cuda"),
        TestOutcome("t4", ("PLAN-4",), "passed"),
        TestOutcome("t5", ("PLAN-4",), "skipped", "one device"),
        TestOutcome("t6", ("DEV-1",), "xfailed", "known bug"),
        TestOutcome("t7", ("DEV-1",), "passed"),
    ]
    statuses = rule_statuses(outcomes)
    assert statuses["PLAN-1"] == {
        "status": "failed",
        "tests": ["t1", "t2"],
        "reason": "call failed",
        "failures": [{"test": "t2", "reason": "call failed"}],
    }
    assert statuses["PLAN-2"]["status"] == "failed"
    assert statuses["PLAN-3"] == {"status": "skipped", "tests": ["t3"], "reason": "no cuda"}
    assert statuses["PLAN-4"] == {"status": "passed", "tests": ["t4", "t5"]}
    assert statuses["DEV-1"]["status"] == "xfailed"
    assert statuses["DEV-2"] == {"status": "untested", "tests": []}
    assert set(statuses) == {rule.id for rule in RULES}


def test_report_shape_and_summary() -> None:
    report = build_report(
        loader_name="x",
        loader_source="test",
        capabilities=["plans"],
        device="cpu",
        outcomes=[TestOutcome("t", ("PLAN-1",), "passed")],
    )
    assert report["schema"] == SCHEMA == "loader-conformance/1"
    assert report["loader"] == {"name": "x", "source": "test", "capabilities": ["plans"]}
    json.dumps(report)
    lines = summary_lines(report)
    assert lines[0] == f"conformance of x on cpu: 1 passed, {len(RULES) - 1} untested"
    assert lines[1] == "  PLAN  passed 1; untested 2,3,4"


def test_unknown_rule_in_outcomes_is_an_error() -> None:
    with pytest.raises(KeyError, match="NOPE-1"):
        rule_statuses([TestOutcome("t", ("NOPE-1",), "passed")])
