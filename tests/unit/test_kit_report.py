"""The conformance kit's values: expectations files, rule statuses, verdicts, the merged matrix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reference.__main__ import main
from reference.kit.conformance import (
    TestOutcome,
    build_report,
    rule_statuses,
    summary_lines,
    unexpected_passes,
    verdict,
)
from reference.kit.expectations import (
    Expectation,
    ExpectationsError,
    expected_reason,
    parse_expectations,
    read_expectations,
)
from reference.kit.matrix import ReportError, load_report, render_matrix
from reference.rules import RULES

pytestmark = pytest.mark.internal

# --- expectations files ---------------------------------------------------------------------


def test_expectations_format_comments_devices_and_reasons() -> None:
    text = (
        "# known defects of our loader\n"
        "\n"
        "ZC-12: adopts tied parameters twice (#41)\n"
        "  DG-5 @cuda: keeps the mapped state dict on the GPU: 1.75x  \n"
        "VAE-9 @cuda:1:only the second card\n"
    )
    expectations = parse_expectations(text, source="known.txt")
    assert expectations.entries == (
        Expectation("ZC-12", None, "adopts tied parameters twice (#41)", 3),
        Expectation("DG-5", "cuda", "keeps the mapped state dict on the GPU: 1.75x", 4),
        Expectation("VAE-9", "cuda:1", "only the second card", 5),
    )
    assert expectations.for_device("cpu") == {"ZC-12": "adopts tied parameters twice (#41)"}
    assert set(expectations.for_device("cuda")) == {"ZC-12", "DG-5"}
    assert set(expectations.for_device("cuda:0")) == {"ZC-12", "DG-5"}
    assert set(expectations.for_device("cuda:1")) == {"ZC-12", "DG-5", "VAE-9"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ZC-12 adopts twice\n", "f.txt:1: cannot read 'ZC-12 adopts twice'"),
        ("\n# c\nZC-99: nope\n", "f.txt:3: 'ZC-99' is not a rule of the catalogue"),
        ("ZC-12 @tpu9x: x\n", "f.txt:1: cannot read"),
        ("ZC-12 @gpu: x\n", "f.txt:1: unknown device 'gpu'"),
        ("ZC-12:   \n", "f.txt:1: ZC-12 needs a reason after the colon"),
        (
            "ZC-12: a\nZC-12 @cuda: b\n",
            "f.txt:2: ZC-12 is already expected on that device at line 1",
        ),
        ("ZC-1 @cuda: a\nZC-1 @cuda:0: b\n", "f.txt:2: ZC-1 is already expected"),
    ],
)
def test_bad_expectations_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(ExpectationsError) as info:
        parse_expectations(text, source="f.txt")
    assert str(info.value).startswith(message)


def test_device_entries_on_different_cards_coexist(tmp_path: Path) -> None:
    path = tmp_path / "known.txt"
    path.write_text("ZC-1 @cuda:0: a\nZC-1 @cuda:1: b\nZC-1 @cpu: c\n")
    expectations = read_expectations(path)
    assert expectations.source == str(path)
    assert [expectations.for_device(d)["ZC-1"] for d in ("cuda:0", "cuda:1", "cpu")] == list("abc")
    assert expectations.for_device("cuda") == {}


def test_failure_is_expected_only_when_every_rule_of_the_test_is() -> None:
    expected = {"ZC-1": "a", "ZC-2": "b"}
    assert expected_reason(("ZC-1",), expected) == "ZC-1: a"
    assert expected_reason(("ZC-2", "ZC-1", "ZC-2"), expected) == "ZC-2: b; ZC-1: a"
    assert expected_reason(("ZC-1", "ZC-3"), expected) is None
    assert expected_reason((), expected) is None


# --- statuses and verdicts --------------------------------------------------------------------


def test_expected_rules_are_xfailed_or_unexpected_passes() -> None:
    outcomes = [
        TestOutcome("t1", ("ZC-1",), "xfailed", "expected: ZC-1: a"),
        TestOutcome("t2", ("ZC-1",), "passed"),
        TestOutcome("t3", ("ZC-2",), "passed"),
        TestOutcome("t4", ("ZC-3",), "skipped", "no zero_copy"),
    ]
    expected = {"ZC-1": "a", "ZC-2": "b", "ZC-3": "c", "ZC-4": "d"}
    statuses = rule_statuses(outcomes, expected)
    assert statuses["ZC-1"] == {
        "status": "xfailed",
        "tests": ["t1", "t2"],
        "reason": "expected: ZC-1: a",
        "expected": "a",
    }
    assert statuses["ZC-2"] == {
        "status": "failed",
        "tests": ["t3"],
        "reason": "XPASS(strict): expected to fail (b) but no test of it failed; remove it from"
        " the expectations",
        "expected": "b",
    }
    assert statuses["ZC-3"]["status"] == "skipped"
    assert statuses["ZC-4"] == {"status": "untested", "tests": [], "expected": "d"}
    report = build_report(
        loader_name="x",
        loader_source="s",
        capabilities=[],
        device="cpu",
        outcomes=outcomes,
        expected=expected,
        expectations_source="known.txt",
    )
    assert unexpected_passes(report) == ["ZC-2"]
    assert report["expectations"] == {"source": "known.txt", "rules": expected}
    with pytest.raises(KeyError, match="NOPE-1"):
        rule_statuses([], {"NOPE-1": "x"})


def make_report(name: str, device: str, statuses: dict[str, str], **loader: Any) -> dict[str, Any]:
    rules = {rule.id: {"status": "untested", "tests": []} for rule in RULES}
    for rule_id, status in statuses.items():
        rules[rule_id] = {"status": status, "tests": [f"t::{rule_id}"]}
    return {
        "schema": "loader-conformance/1",
        "loader": {"name": name, "source": "test", "capabilities": ["plans"], **loader},
        "device": device,
        "rules": rules,
    }


def test_verdicts() -> None:
    good = make_report("ref", "cpu", {"PLAN-1": "passed", "PLAN-2": "skipped", "ZC-14": "failed"})
    assert verdict(good) == (
        "ref@cpu: conforms to all MUST rules of its declared capabilities that the suite tests"
        f" (1 passed, 1 skipped, {len(RULES) - 3} untested); declines SHOULD rules: ZC-14"
    )
    bad = make_report("b", "cuda", {"PLAN-1": "failed", "ZC-12": "xfailed", "DG-6": "failed"})
    assert verdict(bad) == "b@cuda: fails 2 MUST rules: PLAN-1, ZC-12 (1 expected: ZC-12)"
    one = make_report("b", "cuda", {"PLAN-1": "failed", "PLAN-2": "passed"})
    assert verdict(one) == "b@cuda: fails 1 MUST rule: PLAN-1"
    idle = make_report("i", "cpu", {"PLAN-1": "skipped"})
    assert verdict(idle) == "i@cpu: nothing judged: no rule passed or failed"


def test_summary_ends_with_unexpected_passes_and_the_verdict() -> None:
    report = build_report(
        loader_name="x",
        loader_source="s",
        capabilities=["plans"],
        device="cpu",
        outcomes=[TestOutcome("t", ("PLAN-1",), "passed")],
        expected={"PLAN-1": "broken"},
    )
    lines = summary_lines(report)
    assert lines[0] == f"conformance of x on cpu: 1 failed, {len(RULES) - 1} untested"
    assert lines[-2].startswith("  PLAN-1: XPASS(strict): expected to fail (broken)")
    assert lines[-1] == "x@cpu: fails 1 MUST rule: PLAN-1"


# --- the matrix -------------------------------------------------------------------------------


def test_matrix_rows_columns_cells_and_verdicts() -> None:
    ref = make_report("reference", "cpu", {"PLAN-1": "passed", "ZC-1": "skipped"})
    naive = make_report("naive", "cuda", {"PLAN-1": "failed", "ZC-1": "xfailed"})
    naive["rules"]["ZZ-1"] = {"status": "passed", "tests": ["t"]}
    del naive["rules"]["DEV-1"]
    text = render_matrix([ref, naive])
    lines = text.splitlines()
    assert lines[0] == "| rule | level | title | reference@cpu | naive@cuda |"
    assert lines[1] == "| --- | --- | --- | --- | --- |"
    title = RULES[0].title
    assert lines[2] == f"| PLAN-1 | MUST | {title} | pass | **FAIL** |"
    assert f"| ZC-1 | MUST | {RULES[7].title} | skip | xfail |" in lines
    assert f"| DEV-1 | MUST | {RULES[4].title} | - | n/a |" in lines
    assert "| ZZ-1 | ? | (not in this catalogue) | n/a | pass |" in lines
    assert len([line for line in lines if line.startswith("| ")]) == 2 + len(RULES) + 1
    assert "- `naive@cuda`: test; capabilities: plans" in lines
    assert lines[-2:] == [
        "- reference@cpu: conforms to all MUST rules of its declared capabilities that the suite"
        f" tests (1 passed, 1 skipped, {len(RULES) - 2} untested)",
        "- naive@cuda: fails 2 MUST rules: PLAN-1, ZC-1 (1 expected: ZC-1)",
    ]


def test_matrix_refuses_nothing_and_collisions() -> None:
    with pytest.raises(ReportError, match="no report to merge"):
        render_matrix([])
    one = make_report("x", "cpu", {})
    with pytest.raises(ReportError, match=r"a.json and b.json are both reports of x@cpu"):
        render_matrix([one, one], origins=["a.json", "b.json"])


def test_load_report_checks_the_schema(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"schema": "other/2"}))
    with pytest.raises(ReportError, match=r"r.json: schema is 'other/2', expected"):
        load_report(path)
    path.write_text("[1]")
    with pytest.raises(ReportError, match="schema is 'list'"):
        load_report(path)
    with pytest.raises(ReportError, match="cannot read a JSON report"):
        load_report(tmp_path / "missing.json")


def test_report_command_prints_or_writes_the_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(make_report("reference", "cpu", {"PLAN-1": "passed"})))
    b.write_text(json.dumps(make_report("naive", "cpu", {"PLAN-1": "failed"})))
    assert main(["report", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert printed == render_matrix([load_report(a), load_report(b)])
    out = tmp_path / "matrix.md"
    assert main(["report", str(a), str(b), "--out", str(out)]) == 0
    assert out.read_text() == printed
    assert capsys.readouterr().out == f"matrix of 2 report(s) written to {out}\n"
    assert main(["report", str(a), str(tmp_path / "none.json")]) == 2
    assert "none.json: cannot read a JSON report" in capsys.readouterr().err
