"""The suite catches bad loaders: each broken loader fails exactly the rules its defect breaks.

These runs test the suite itself, at length: they are `selftest`s (`tox -e selftest`), except one
broken loader kept in the unit tier as a smoke test of the machinery.

Every case runs, in process, the contract test files that name the rules a broken loader is expected
to fail (`breaks` and `also_fails`), with `--loader=fakes.broken:<L>`, and reads the
JSON report: the run must fail, and its failed rules must be exactly the expected ones, so a defect
that slips through, or spills into rules it should not touch, fails here. The blast radius is
checked test by test too: every failing test must name a rule the defect breaks (one defect, its
rules only). A correct variant (`fakes/broken: CORRECT`: what SPEC leaves free) must
fail nothing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import fakes.broken
from fakes.broken import BROKEN, CORRECT, BrokenAdapter
from reference.rules import BY_ID, RULES

pytestmark = pytest.mark.internal

UNIT = Path(__file__).resolve().parent
# It starts two ranks in fresh processes (seconds each); the in-process TP test pins its rules.
SLOW = "tests/unit/test_tp.py::test_tp2_over_torch_distributed"
# Property-based: against a broken loader hypothesis shrinks each failing example, which takes
# minutes; the corpus tests judge the same rules in seconds.
PROPERTY_BASED = "test_fuzz.py"
# The hostile corpus runs every case in a child process on five paths (about 100 s a run, and
# three runs need it); a run here keeps the DiT's adoption path for the weights and the
# transformer for the pipeline files. The unit tier runs every path against the reference.
CORPUS = "tests/unit/test_hostile_corpus.py::test_hostile_"
NARROWED_CORPUS = tuple(
    f"{CORPUS}{test}_are_refused_in_one_line_in_bounded_time_and_memory[{path}-"
    for test, paths in (
        ("weights", ("dit-direct", "vae", "transformer")),  # "vae" covers vae-stream too
        ("pipeline_files", ("vae",)),
    )
    for path in paths
)
QUOTED_RULE = re.compile(r"[\"']([A-Z0-9]+-\d+[a-z]?)[\"']")


def contract_files(rules: frozenset[str]) -> list[Path]:
    """The contract test files (not the suite's internal ones) that mention any of `rules`."""
    files = []
    for path in sorted(UNIT.glob("test_*.py")):
        text = path.read_text(encoding="utf-8")
        if "pytestmark = pytest.mark.internal" in text or path.name == PROPERTY_BASED:
            continue
        if rules & set(QUOTED_RULE.findall(text)):
            files.append(path)
    return files


@pytest.fixture(autouse=True)
def suite_under_test(request: pytest.FixtureRequest) -> None:
    """These runs judge the suite, not the loader under test: the CPU tier with the reference
    runs them; a run judging another loader, or the gpu tier, skips them."""
    conformance = request.config.pluginmanager.get_plugin("conformance")
    if not conformance.judges_reference or conformance.device != "cpu":
        pytest.skip("judges the suite itself: runs in the CPU tier with the reference loader")


def run_report(
    spec: str, files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, dict[str, Any]]:
    """Run `files` against the loader `spec` names; pytest's exit code and the JSON report.

    `pytest.main` runs in this process: torch cannot import its modules twice, so the run must
    not drop what it imported (as pytester's in-process runs do), and a fresh interpreter per
    loader would cost seconds each. Only the plugin the contract tests use is loaded, and the
    unraisable-exception plugin, whose forced garbage collections cost a second a run, is off;
    so is the logging plugin where no file captures logs (`caplog`): at each test's setup, call
    and teardown it attaches its handler to every logger that does not propagate, after a walk
    over every logger diffusers and transformers made (a fifth of a run of the zero-copy files).
    """
    report_path = tmp_path / "report.json"
    captures = any("caplog" in path.read_text(encoding="utf-8") for path in files)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    code = pytest.main(
        [
            *map(str, files),
            f"--loader={spec}",
            f"--conformance-report={report_path}",
            "--runtime-device=cpu",
            "-m",
            "not internal",
            "--deselect",
            SLOW,
            *(arg for prefix in NARROWED_CORPUS for arg in ("--deselect", prefix)),
            f"--basetemp={tmp_path / 'run'}",
            "-p",
            "reference.kit.plugin",
            "-p",
            "pytest_mock",
            "-p",
            "no:unraisableexception",
            "-p",
            "no:cacheprovider",
            *(() if captures else ("-p", "no:logging")),
            "-q",
            "--no-header",
            "--tb=line",
        ]
    )
    # Dozens of runs, each writing its own checkpoints: keep none of them.
    shutil.rmtree(tmp_path / "run", ignore_errors=True)
    return int(code), json.loads(report_path.read_text())


def failed_rules(
    spec: str, files: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> set[str]:
    """Run `files` against the loader `spec` names, which must fail; the rules it failed."""
    code, report = run_report(spec, files, tmp_path, monkeypatch)
    assert code == pytest.ExitCode.TESTS_FAILED
    return {rule for rule, entry in report["rules"].items() if entry["status"] == "failed"}


def failing_tests(report: dict[str, Any]) -> dict[str, set[str]]:
    """Each failing test of a report, with every rule it names."""
    failing = {f["test"] for entry in report["rules"].values() for f in entry.get("failures", [])}
    named: dict[str, set[str]] = {test: set() for test in failing}
    for rule, entry in report["rules"].items():
        for test in set(entry["tests"]) & failing:
            named[test].add(rule)
    return named


# The unit tier's smoke: a broken loader whose contract files run in about a second.
SMOKE = fakes.broken.MutablePlans


@pytest.mark.parametrize(
    "adapter",
    [pytest.param(a, marks=() if a is SMOKE else pytest.mark.selftest) for a in BROKEN],
    ids=lambda cls: cls.__name__,
)
def test_the_suite_fails_exactly_the_rules_the_defect_breaks(
    adapter: type[BrokenAdapter], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if adapter.gpu_only:
        pytest.skip(f"only a device shows this defect: {adapter.gpu_only}")
    files = contract_files(adapter.expected_failures())
    code, report = run_report(f"fakes.broken:{adapter.__name__}", files, tmp_path, monkeypatch)
    assert code == pytest.ExitCode.TESTS_FAILED
    failed = {rule for rule, entry in report["rules"].items() if entry["status"] == "failed"}
    assert adapter.breaks <= failed, f"the suite misses the defect: {adapter.__doc__}"
    assert failed == adapter.expected_failures()
    # The blast radius, test by test: each failing test names a rule the defect breaks.
    stray = {t: sorted(r) for t, r in failing_tests(report).items() if not r & adapter.breaks}
    assert stray == {}, f"tests that fail for rules the defect does not break: {stray}"


@pytest.mark.selftest
@pytest.mark.parametrize("adapter", CORRECT, ids=lambda cls: cls.__name__)
def test_a_correct_variant_fails_nothing(
    adapter: type[BrokenAdapter], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What SPEC leaves free, done another way than the reference does it: no rule fails."""
    files = contract_files(adapter.exercises)  # type: ignore[attr-defined]
    code, report = run_report(f"fakes.broken:{adapter.__name__}", files, tmp_path, monkeypatch)
    failed = sorted(r for r, e in report["rules"].items() if e["status"] == "failed")
    assert failed == [], {r: report["rules"][r].get("failures") for r in failed}
    assert code == pytest.ExitCode.OK


def test_every_must_rule_is_broken_by_some_loader() -> None:
    broken = frozenset().union(*(adapter.breaks for adapter in BROKEN))
    must = {rule.id for rule in RULES if rule.level == "MUST"}
    assert sorted(must - broken) == []


def test_broken_loaders_are_well_formed() -> None:
    names = [adapter.name for adapter in BROKEN]
    assert len(set(names)) == len(names)
    assert all(name.startswith("broken-") for name in names)
    defined, todo = set(), [BrokenAdapter]
    while todo:
        subclasses = todo.pop().__subclasses__()
        defined.update(cls for cls in subclasses if cls.breaks)
        todo.extend(subclasses)
    assert defined == set(BROKEN), "every broken loader is listed in BROKEN"
    assert all(getattr(fakes.broken, cls.__name__) is cls for cls in BROKEN)
    for adapter in BROKEN:
        assert adapter.breaks, adapter.__name__
        assert adapter.breaks | set(adapter.also_fails) <= set(BY_ID), adapter.__name__
        assert not adapter.breaks & set(adapter.also_fails), adapter.__name__
        assert all(adapter.also_fails.values()), f"{adapter.__name__}: every extra has a reason"
        assert adapter.__doc__, adapter.__name__


@pytest.mark.selftest
def test_a_loader_worded_its_own_way_fails_only_the_reasons_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every decision right, every error a different class and message, no reasons: the suite
    judges what a loader does, so only ZC-14 (the report's reasons) may fail."""
    files = contract_files(frozenset(BY_ID))
    failed = failed_rules("fakes.reworded:RewordedAdapter", files, tmp_path, monkeypatch)
    assert failed == {"ZC-14"}


# What each plain-PyTorch baseline honours all the same. Both: requires_grad as plain loading
# gives it (VAE-10), the decode dtype through the model's own hook or not at all (VAE-11).
# Copying everything never adopts what ZC-2c refuses. assign=True: safetensors maps the file
# copy-on-write, so it never writes the checkpoint (ZC-13), and load_state_dict(strict=True)
# into a meta-built module fills exactly the state-dict keys (VAE-4, VAE-5).
HONOURED = {
    "reference.kit.adapters.baselines:PlainLoadStateDict": frozenset(
        {"ZC-2c", "ZC-11", "VAE-10", "VAE-11"}
    ),
    "reference.kit.adapters.baselines:PlainAssign": frozenset(
        {"ZC-13", "VAE-4", "VAE-5", "VAE-10", "VAE-11"}
    ),
}


@pytest.mark.selftest
@pytest.mark.parametrize("spec", sorted(HONOURED))
def test_plain_pytorch_loading_fails_the_zero_copy_and_vae_rules_it_does_not_honour(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged = frozenset(r.id for r in RULES if r.level == "MUST" and r.section in ("ZC", "VAE"))
    failed = failed_rules(spec, contract_files(judged), tmp_path, monkeypatch)
    assert sorted(judged - HONOURED[spec] - failed) == []
    assert sorted(HONOURED[spec] & failed) == []
