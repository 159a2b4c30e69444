"""The conformance kit: choosing the loader under test, the seam it is reached through, failure
lines, expectations, the merged matrix.

The plugin tests run this repository's conftest against a tiny suite in a temporary directory
(pytester, in process) and assert on outcomes, messages and the JSON report.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import reference
from reference.errors import CheckpointError
from reference.kit.adapters.reference import ReferenceAdapter
from reference.kit.failures import SeamView
from reference.kit.isolated import attempt, attempt_with
from reference.kit.judging.judge import skip_cpu_runtime_without_the_setting
from reference.kit.seam import CHECKPOINT_SAFETY, PLANS, VAE_STREAM, Unsupported, VaeRequest
from reference.kit.selection import (
    ENTRY_POINT_GROUP,
    ENV_VAR,
    SelectionError,
    check_adapter,
    resolve_spec,
    select_adapter,
)

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.internal

PLUGIN = "reference.kit.plugin"

ADAPTERS = """
from reference.kit.seam import PLANS, VAE_STREAM, ZERO_COPY

class Good:
    name = "good"
    capabilities = frozenset({PLANS, ZERO_COPY})
    plan_two_ok = True

class PlansOnly:
    name = "plans-only"
    capabilities = frozenset({PLANS})
    plan_two_ok = False

class VaeOnly:
    name = "vae-only"
    capabilities = frozenset({VAE_STREAM})

def make_good():
    return Good()

INSTANCE = PlansOnly()
"""

SUITE = """
import pytest
from reference.kit.seam import PLANS, ZERO_COPY

@pytest.mark.rule("PLAN-1")
@pytest.mark.capability(PLANS)
def test_plan_one(loader):
    assert loader.name

@pytest.mark.rule("PLAN-2")
@pytest.mark.capability(PLANS)
def test_plan_two(loader):
    assert loader.plan_two_ok

@pytest.mark.rule("ZC-1")
@pytest.mark.capability(ZERO_COPY)
def test_zero_copy(loader, runtime_device):
    assert runtime_device.type == "cpu"

@pytest.mark.internal
def test_machinery():
    pass
"""


@pytest.fixture
def kit(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A temporary project holding the real plugin, a tiny suite and a module of adapters."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")  # the plugin needs none; faster
    pytester.makepyfile(tinyloaders=ADAPTERS, test_tiny=SUITE)
    # What a clone's tests/conftest.py holds. Loading it also puts the folder, and so the
    # adapters module, on sys.path of pytest-xdist's workers.
    pytester.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    pytester.syspathinsert()
    return pytester


def run(kit: pytest.Pytester, *args: str) -> pytest.RunResult:
    return kit.runpytest("-p", "no:cacheprovider", "-rsx", *args)


def report_of(kit: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    path = kit.path / "report.json"
    result = run(kit, f"--conformance-report={path}", *args)
    return result, json.loads(path.read_text())


# --- choosing the loader ----------------------------------------------------------------------


def test_unresolvable_loader_is_a_usage_error_naming_the_three_ways(kit: pytest.Pytester) -> None:
    result = run(kit, "--loader=no.such:thing")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert (
        "cannot use loader 'no.such:thing' (from --loader): cannot import module 'no.such'" in err
    )
    for way in ("--loader=package.module:attr", "--loader=NAME", f"{ENV_VAR}=SPEC"):
        assert way in err
    assert "passed" not in result.stdout.str()


def test_unresolvable_environment_spec_is_a_usage_error(
    kit: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "tinyloaders:Missing")
    result = run(kit)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        f"cannot use loader 'tinyloaders:Missing' (from {ENV_VAR}): module 'tinyloaders' has no "
        "attribute 'Missing'" in result.stderr.str()
    )


def test_header_names_adapter_how_chosen_capabilities_and_device(kit: pytest.Pytester) -> None:
    result = run(kit, "--loader=tinyloaders:make_good")
    result.stdout.fnmatch_lines(
        [
            "loader under test: good, chosen by --loader=tinyloaders:make_good",
            "capabilities: plans, zero_copy",
            "expectations: none *",
            "runtime device: cpu; torch *",
        ]
    )
    result.assert_outcomes(passed=4)


@pytest.mark.parametrize(
    "workers",
    [pytest.param(0, id="serial"), pytest.param(2, id="xdist", marks=pytest.mark.long)],
)
def test_without_a_chosen_loader_contract_tests_are_a_usage_error(
    kit: pytest.Pytester, workers: int
) -> None:
    """Nothing is judged by default: a run that collects a contract test without --loader or
    the variable stops before any test runs, listing the three ways (CI that forgets the flag
    goes red, not green)."""
    if workers:
        pytest.importorskip("xdist")
    result = run(kit, *(["-p", "xdist", "-n", str(workers)] if workers else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    assert "no loader under test was chosen" in text
    for way in ("--loader=package.module:attr", "--loader=NAME", f"{ENV_VAR}=SPEC"):
        assert way in text
    assert "passed" not in result.stdout.str()
    assert run(kit, "--conformance-report=r.json", "-m", "internal").ret == (
        pytest.ExitCode.USAGE_ERROR
    )
    assert not (kit.path / "r.json").exists()


SLOW_SUITE = """
import pytest

@pytest.mark.internal
def test_quick():
    pass

@pytest.mark.internal
@pytest.mark.selftest
def test_at_length():
    pass

@pytest.mark.internal
@pytest.mark.long
def test_end_to_end():
    pass
"""


def test_a_plain_run_leaves_the_selftest_and_long_tests_out_unless_asked(
    kit: pytest.Pytester,
) -> None:
    kit.makepyfile(test_slow=SLOW_SUITE)
    loader = "--loader=tinyloaders:PlansOnly"
    run(kit, "test_slow.py", loader).assert_outcomes(passed=1, deselected=2)
    run(kit, "test_slow.py", loader, "-m", "selftest or long").assert_outcomes(
        passed=2, deselected=1
    )
    run(kit, "test_slow.py::test_end_to_end", loader).assert_outcomes(passed=1)


def test_option_beats_environment(kit: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "tinyloaders:INSTANCE")
    run(kit).stdout.fnmatch_lines([f"loader under test: plans-only, chosen by {ENV_VAR}=*"])
    result = run(kit, "--loader=tinyloaders:Good")
    result.stdout.fnmatch_lines(["loader under test: good, chosen by --loader=tinyloaders:Good"])


def test_entry_point_names_a_loader(kit: pytest.Pytester) -> None:
    dist = kit.mkdir("tiny_adapters-0.1.dist-info")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-adapters\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ntiny = tinyloaders:Good\nstale = tinyloaders:Gone\n"
    )
    result = run(kit, "--loader=tiny")
    result.stdout.fnmatch_lines(["loader under test: good, chosen by --loader=tiny"])
    result = run(kit, "--loader=tinier")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no entry point named 'tinier' in group" in result.stderr.str()
    installed = re.search(r"\(installed: ([^)]*)\)", result.stderr.str())
    assert installed is not None
    # The project's own entry point ("reference") is listed too where the package is installed.
    assert {"stale", "tiny"} <= set(installed.group(1).split(", "))
    result = run(kit, "--loader=stale")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "entry point 'stale' (tinyloaders:Gone) failed to load: AttributeError"
        in result.stderr.str()
    )


# --- capabilities ---------------------------------------------------------------------------


def test_undeclared_capability_is_skipped_naming_it_and_the_adapter(kit: pytest.Pytester) -> None:
    result, report = report_of(kit, "--loader=tinyloaders:PlansOnly")
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    reason = "loader 'plans-only' does not declare capability 'zero_copy'"
    result.stdout.fnmatch_lines([f"SKIPPED * {reason}"])
    assert report["loader"]["capabilities"] == ["plans"]
    assert report["rules"]["ZC-1"] == {
        "status": "skipped",
        "tests": ["test_tiny.py::test_zero_copy"],
        "reason": reason,
    }
    assert report["rules"]["PLAN-1"]["status"] == "passed"
    assert report["rules"]["PLAN-2"]["status"] == "failed"
    result.stdout.fnmatch_lines(["plans-only@cpu: fails 1 MUST rule: PLAN-2"])


def test_adapter_whose_capabilities_run_nothing_fails_the_run(kit: pytest.Pytester) -> None:
    result, report = report_of(kit, "--loader=tinyloaders:VaeOnly")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["FAILED: no contract test ran*'vae-only' was not judged*"])
    assert {report["rules"][r]["status"] for r in ("PLAN-1", "PLAN-2", "ZC-1")} == {"skipped"}


# --- nothing to judge -------------------------------------------------------------------------


def test_no_contract_test_collected_is_an_error_when_judging(kit: pytest.Pytester) -> None:
    result = run(kit, "-m", "internal", "--loader=tinyloaders:Good", "--conformance-report=r.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "no contract test was collected (1 test(s) selected" in result.stderr.str()
    assert not (kit.path / "r.json").exists()
    # The suite's own tests alone (the selftest tier) run, and get no verdict.
    internal = run(kit, "-m", "internal", "--loader=tinyloaders:Good")
    assert internal.ret == pytest.ExitCode.OK
    assert not re.search(r"=+ conformance =+", internal.stdout.str())
    result = run(
        kit, "-k", "nothing_matches", "--conformance-report=r.json", "--loader=tinyloaders:Good"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (kit.path / "r.json").exists()
    # Without a loader, expectations or report to produce, a run of internal tests is fine.
    assert run(kit, "-m", "internal").ret == pytest.ExitCode.OK


def test_a_run_of_other_tests_gets_no_conformance_section(kit: pytest.Pytester) -> None:
    """The installed plugin loads into every pytest run of the environment: a project's own
    tests, which name no rule and judge no loader, must not get a verdict."""
    quiet = run(kit, "-m", "internal")
    assert quiet.ret == pytest.ExitCode.OK
    assert not re.search(r"=+ conformance =+", quiet.stdout.str())
    judged = run(kit, "-k", "plan_one", "--loader=tinyloaders:Good")
    judged.stdout.fnmatch_lines(["*= conformance =*", "good@cpu: *"])


def test_collection_errors_are_not_masked(kit: pytest.Pytester) -> None:
    kit.makepyfile(test_broken="import no_such_module_here\n")
    result = run(kit, "test_broken.py", "--loader=tinyloaders:Good")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*ModuleNotFoundError*no_such_module_here*"])


# --- expectations -----------------------------------------------------------------------------


def test_expected_failure_is_xfailed_and_device_entries_apply_only_there(
    kit: pytest.Pytester,
) -> None:
    kit.path.joinpath("known.txt").write_text(
        "# known defects\nPLAN-2: ignores the post-process flag (#12)\nPLAN-1 @cuda: gpu only\n"
    )
    result, report = report_of(kit, "--loader=tinyloaders:PlansOnly", "--expectations=known.txt")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(
        ["expectations: known.txt: 2 entries; expected to fail on cpu: PLAN-2"]
    )
    assert report["rules"]["PLAN-2"] == {
        "status": "xfailed",
        "tests": ["test_tiny.py::test_plan_two"],
        "reason": "expected: PLAN-2: ignores the post-process flag (#12)",
        "expected": "ignores the post-process flag (#12)",
    }
    assert report["rules"]["PLAN-1"]["status"] == "passed"
    assert report["expectations"] == {
        "source": "known.txt",
        "rules": {"PLAN-2": "ignores the post-process flag (#12)"},
    }
    result.stdout.fnmatch_lines(["plans-only@cpu: fails 1 MUST rule: PLAN-2 (1 expected: PLAN-2)"])


def test_expected_failure_that_passes_fails_the_run(kit: pytest.Pytester) -> None:
    kit.path.joinpath("known.txt").write_text("PLAN-2: was broken\n")
    result, report = report_of(kit, "--loader=tinyloaders:Good", "--expectations=known.txt")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["FAILED: expected to fail but passed: PLAN-2; *known.txt"])
    assert report["rules"]["PLAN-2"]["status"] == "failed"
    assert report["rules"]["PLAN-2"]["reason"].startswith("XPASS(strict): expected to fail")


def test_failure_is_expected_only_when_all_its_rules_are(kit: pytest.Pytester) -> None:
    kit.makepyfile(
        test_pair="""
import pytest

@pytest.mark.rule("DEV-1", "DEV-3")
def test_pair(loader):
    assert loader.plan_two_ok
"""
    )
    kit.path.joinpath("known.txt").write_text("DEV-1: broken\n")
    args = ("test_pair.py", "--loader=tinyloaders:PlansOnly")
    result, report = report_of(kit, *args, "--expectations=known.txt")
    result.assert_outcomes(failed=1)
    assert report["rules"]["DEV-3"]["status"] == "failed"
    kit.path.joinpath("known.txt").write_text("DEV-1: broken\nDEV-3: broken too\n")
    result, report = report_of(kit, *args, "--expectations=known.txt")
    result.assert_outcomes(xfailed=1)
    assert report["rules"]["DEV-3"]["reason"] == "expected: DEV-1: broken; DEV-3: broken too"


def test_unknown_rule_in_expectations_is_a_usage_error(kit: pytest.Pytester) -> None:
    kit.path.joinpath("known.txt").write_text("PLAN-2: fine\nZC-99: no such rule\n")
    result = run(kit, "--expectations=known.txt", "--loader=tinyloaders:Good")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "known.txt:2: 'ZC-99' is not a rule of the catalogue" in result.stderr.str()
    result = run(kit, "--expectations=missing.txt", "--loader=tinyloaders:Good")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot read expectations file missing.txt" in result.stderr.str()


# --- resolving a SPEC, directly ---------------------------------------------------------------


class Named:
    name = "named"
    capabilities = frozenset({PLANS})

    class Inner:
        name = "inner"
        capabilities = frozenset({PLANS})


def broken_factory() -> Named:
    raise RuntimeError("needs a GPU")


NOT_AN_ADAPTER = 42


def test_spec_forms_object_class_factory_and_dotted_attribute() -> None:
    assert isinstance(
        resolve_spec("reference.kit.adapters.reference:ReferenceAdapter", origin="x"),
        ReferenceAdapter,
    )
    assert resolve_spec(f"{__name__}:Named", origin="x").name == "named"
    assert resolve_spec(f"{__name__}:Named.Inner", origin="x").name == "inner"
    instance = Named()
    assert check_adapter(instance) is instance
    assert select_adapter(option=None, environ={ENV_VAR: ""}) is None  # no default
    assert isinstance(resolve_spec("reference", origin="x"), ReferenceAdapter)
    selection = select_adapter(option=None, environ={ENV_VAR: f"{__name__}:Named"})
    assert selection is not None
    assert (selection.how, selection.spec, selection.adapter.name) == (
        "environment",
        f"{__name__}:Named",
        "named",
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("reference.kit.seam:", "expected package.module:attr with both parts non-empty"),
        (
            f"{__name__}:broken_factory",
            "calling it with no arguments raised RuntimeError: needs a GPU",
        ),
        (
            f"{__name__}:NOT_AN_ADAPTER",
            "it names a int, which has no non-empty str attribute 'name'",
        ),
        ("", "no entry point named '' in group"),
    ],
)
def test_bad_specs_are_refused_with_the_cause(spec: str, message: str) -> None:
    with pytest.raises(SelectionError) as info:
        select_adapter(option=spec, environ={})
    assert message in str(info.value)
    assert "Choose the loader under test in one of three ways" in str(info.value)


@pytest.mark.parametrize(
    ("capabilities", "message"),
    [
        ({PLANS}, "whose 'capabilities' is set, not a frozenset"),
        (
            frozenset({PLANS, "teleport"}),
            "declares unknown capabilities teleport; known: admission",
        ),
        (frozenset(), "declares no capability, so every contract test would be skipped"),
    ],
)
def test_adapter_capabilities_must_be_known_and_frozen(capabilities: object, message: str) -> None:
    adapter = Named()
    adapter.capabilities = capabilities  # type: ignore[assignment]
    with pytest.raises(SelectionError, match=message):
        check_adapter(adapter)


# --- tests that judge the reference alone -----------------------------------------------------

REFERENCE_ONLY = """
import pytest
from reference.kit.adapters.reference import ReferenceAdapter

class Subclass(ReferenceAdapter):
    name = "subclass"

@pytest.mark.rule("PLAN-3")
@pytest.mark.reference_only("it reads the reference's wording")
def test_wording(loader):
    assert loader.name == "reference"

@pytest.mark.rule("PLAN-4")
def test_behaviour(loader):
    assert loader.name
"""


@pytest.mark.parametrize("spec", ["tinyloaders:Good", "test_only:Subclass"])
def test_reference_only_tests_skip_and_credit_nothing_for_another_loader(
    kit: pytest.Pytester, spec: str
) -> None:
    kit.makepyfile(test_only=REFERENCE_ONLY)
    result, report = report_of(kit, "test_only.py", f"--loader={spec}")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(
        ["SKIPPED * judges the reference alone: it reads the reference's wording"]
    )
    assert report["rules"]["PLAN-3"]["status"] == "untested"
    assert report["rules"]["PLAN-4"]["status"] == "passed"


def test_reference_only_tests_judge_the_reference(kit: pytest.Pytester) -> None:
    kit.makepyfile(test_only=REFERENCE_ONLY)
    result, report = report_of(kit, "test_only.py", "--loader=reference")
    result.assert_outcomes(passed=2)
    assert report["rules"]["PLAN-3"]["status"] == "passed"


# --- pytest-xdist ---------------------------------------------------------------------------


@pytest.mark.long  # a whole pytest run of the kit in a child
def test_a_distributed_run_reports_what_a_serial_run_does(kit: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    _, serial = report_of(kit, "--loader=tinyloaders:PlansOnly")
    (kit.path / "report.json").unlink()
    result, distributed = report_of(kit, "--loader=tinyloaders:PlansOnly", "-p", "xdist", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert distributed["rules"] == serial["rules"]
    result.stdout.fnmatch_lines(["plans-only@cpu: fails 1 MUST rule: PLAN-2"])


@pytest.mark.long  # a whole pytest run of the kit in a child
@pytest.mark.parametrize("tb", ["auto", "long"])
def test_a_failure_naming_a_path_that_is_not_utf8_is_reported_not_fatal(
    kit: pytest.Pytester, tb: str
) -> None:
    """A loader's error may carry such a path (lone surrogates): pytest-xdist cannot send that
    text between processes, so the plugin makes it printable; the run reports the failure."""
    pytest.importorskip("xdist")
    kit.makepyfile(
        test_surrogate="""
import os
import pytest
from reference.kit.seam import PLANS

@pytest.mark.rule("PLAN-1")
@pytest.mark.capability(PLANS)
def test_names_a_strange_path(loader):
    raise ValueError("cannot open " + os.fsdecode(b"/tmp/ck\\xffpt/model.safetensors"))
"""
    )
    result, report = report_of(
        kit,
        "test_surrogate.py",
        "--loader=tinyloaders:PlansOnly",
        f"--tb={tb}",
        "-p",
        "xdist",
        "-n",
        "1",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert report["rules"]["PLAN-1"]["status"] == "failed"
    assert "\\udcff" in report["rules"]["PLAN-1"]["reason"]


@pytest.mark.long  # a whole pytest run of the kit in a child
def test_a_distributed_run_with_nothing_to_judge_is_an_error(kit: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    result = run(
        kit,
        "-k",
        "nothing_matches",
        "--conformance-report=r.json",
        "--loader=tinyloaders:Good",
        "-p",
        "xdist",
        "-n",
        "2",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert not (kit.path / "r.json").exists()
    internal = run(kit, "-m", "internal", "--loader=tinyloaders:Good", "-p", "xdist", "-n", "2")
    assert internal.ret == pytest.ExitCode.OK


def test_the_package_loads_no_plugin_into_other_pytest_runs() -> None:
    """No pytest11 entry point: installing the kit changes no other pytest run (nor imports
    torch into it); conform and the clone's conftest name the plugin themselves."""
    from importlib.metadata import entry_points

    ours = [e for e in entry_points(group="pytest11") if e.value.startswith("reference")]
    assert ours == []


def test_the_kit_has_no_second_import_path() -> None:
    """0.1.0 is unreleased: the seam and the baselines live in reference.kit only."""
    import importlib.util

    assert importlib.util.find_spec("reference.adapter") is None
    assert importlib.util.find_spec("reference.baseline") is None
    assert (
        resolve_spec("reference.kit.adapters.baselines:PlainAssign", origin="x").name
        == "plain-assign"
    )


# --- the seam, and what a failure says ---------------------------------------------------------

SEAM = """
import pytest
import torch
from reference.kit.seam import PLANS, VAE_STREAM

@pytest.mark.rule("PLAN-1")
@pytest.mark.capability(PLANS)
def test_reaches_another_capability(loader):
    loader.load_vae(None, None, device=torch.device("cpu"))

@pytest.mark.rule("PLAN-2")
@pytest.mark.capability(PLANS)
@pytest.mark.parametrize("row", ["no-post-process-device"])
def test_fails_saying_what(loader, row):
    assert loader.plan_two_ok, "expected a deferred plan; the loader made none"

@pytest.mark.rule("PLAN-4")
@pytest.mark.capability(PLANS)
def test_tensors_differ(loader):
    got, handed = torch.arange(100000.0), torch.zeros(100000)
    assert got is handed

@pytest.mark.rule("DEV-1")
@pytest.mark.capability(PLANS)
def test_passes(loader):
    assert loader.name
"""


def test_a_call_outside_the_tests_capabilities_is_a_suite_defect(kit: pytest.Pytester) -> None:
    """A test reaches the loader only through the methods of its own capabilities: a call to
    another capability's method fails the test naming the method and the capability, blames no
    rule of the loader, and fails the run."""
    kit.makepyfile(test_seam=SEAM)
    result, report = report_of(
        kit, "test_seam.py", "-k", "another or passes", "--loader=tinyloaders:Good"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*SUITE DEFECT: test_seam.py::test_reaches_another_capability: the test calls load_vae,"
            " a method of capability vae_stream, but is marked with plans*"
        ]
    )
    assert report["rules"]["PLAN-1"]["status"] == "untested"
    assert report["rules"]["DEV-1"]["status"] == "passed"


def test_a_failure_is_one_line_rule_first_and_the_report_keeps_it(kit: pytest.Pytester) -> None:
    kit.makepyfile(test_seam=SEAM)
    result, report = report_of(
        kit, "test_seam.py", "-k", "saying or differ", "--loader=tinyloaders:PlansOnly"
    )
    out = result.stdout.str()
    line = (
        "PLAN-2: fails saying what [no-post-process-device]: expected a deferred plan; the"
        " loader made none"
    )
    assert line in out
    assert report["rules"]["PLAN-2"]["failures"] == [
        {"test": "test_seam.py::test_fails_saying_what[no-post-process-device]", "reason": line}
    ]
    assert report["rules"]["PLAN-2"]["reason"] == line
    tensors = report["rules"]["PLAN-4"]["reason"]
    assert tensors.startswith("PLAN-4: tensors differ: ")
    assert "Tensor(torch.float32, (100000,), cpu)" in tensors
    assert len(tensors) < 400
    assert "99999" not in out  # no tensor printed whole
    assert "Traceback" not in out


@pytest.mark.long  # a whole pytest run of the kit in a child
def test_a_ctrl_c_ends_with_pytests_summary_and_no_false_diagnosis(
    kit: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit.makepyfile(
        test_interrupt="""
import pytest
from reference.kit.seam import PLANS

@pytest.mark.rule("PLAN-1")
@pytest.mark.capability(PLANS)
def test_interrupted(loader):
    raise KeyboardInterrupt
"""
    )
    # In a subprocess: the interrupt must not reach the pytest running this test. The package
    # may be uninstalled (a bare venv runs the suite from the clone): its folder goes on the path.
    home = str(Path(reference.__file__).resolve().parents[1])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [home, os.environ.get("PYTHONPATH")]))
    )
    result = kit.runpytest_subprocess(
        "-p", "no:cacheprovider", "test_interrupt.py", "--loader=tinyloaders:Good"
    )
    assert result.ret == pytest.ExitCode.INTERRUPTED
    text = result.stdout.str() + result.stderr.str()
    assert "KeyboardInterrupt" in text
    assert "no contract test was collected" not in text
    assert "-k / -m" not in text


# --- attempts that can block -----------------------------------------------------------------


class SlowReader:
    name = "slow-reader"
    capabilities = frozenset({CHECKPOINT_SAFETY})

    def inspect_checkpoint(self, path: object) -> dict[str, object]:
        if str(path) == "block":
            time.sleep(600)
        if str(path) == "refuse":
            raise CheckpointError("refuse", None, "not a checkpoint")
        if str(path) == "unsupported":
            raise Unsupported("this loader takes no such path")
        return {"a": 1}

    def read_checkpoint_tensor(self, path: object, name: str, *, device: object) -> None:
        raise AssertionError("the seam lets the test reach this, but it did not ask")


@pytest.mark.selftest  # four fresh interpreters: seconds each
def test_an_isolated_attempt_that_blocks_is_killed_and_the_others_report() -> None:
    spec = f"{__name__}:SlowReader"
    marked = frozenset({CHECKPOINT_SAFETY})
    started = time.monotonic()
    # The deadline counts from the child's readiness, so a short one still blocks only "block".
    blocked = attempt(spec, marked, "inspect_checkpoint", "block", deadline=2)
    assert blocked.outcome == "blocked"
    assert time.monotonic() - started < 30
    refused = attempt(spec, marked, "inspect_checkpoint", "refuse")
    assert refused.raised("CheckpointError")
    assert refused.raised("ValueError")
    assert refused.attributes == {"file": "refuse", "entry": None}
    assert attempt(spec, marked, "inspect_checkpoint", "ok").outcome == "returned"
    outside = attempt(spec, frozenset({PLANS}), "inspect_checkpoint", "ok")
    assert outside.raised("SeamViolation")
    # The adapter's `Unsupported` is the seam's answer, wherever raised: a skip, not a failure.
    with pytest.raises(pytest.skip.Exception, match="takes no such path"):
        attempt(spec, marked, "inspect_checkpoint", "unsupported")
    # A warm-up that fails is no refusal of the measured call: the attempt never ran.
    cold = attempt_with(spec, marked, inspect, "ok", warm=(inspect, ("refuse",), {}))
    assert cold.outcome == "crashed", cold
    assert "warming" in cold.message


def inspect(loader: Any, path: str) -> object:
    """`loader.inspect_checkpoint(path)`, module-level for an isolated attempt."""
    return loader.inspect_checkpoint(path)


CPU = torch.device("cpu")


# --- options a loader does not take, and a loader without a runtime-device setting -------------


class DecidesItsOwnDtype:
    name = "decides-its-own-dtype"
    capabilities = frozenset({VAE_STREAM})

    def load_vae(self, request: VaeRequest) -> None:
        if request.decode_dtype == torch.float64:
            raise Unsupported("this loader picks the decode dtype itself")
        raise NotImplementedError("a bug inside the load")


def test_an_unsupported_option_skips_and_nothing_else_does() -> None:
    """The seam's `Unsupported` from a seam method skips the test saying why; any other error,
    a NotImplementedError from inside a load included, stays the loader's failure."""
    view = SeamView(DecidesItsOwnDtype(), allowed=frozenset({"load_vae"}), marked=frozenset())
    with pytest.raises(pytest.skip.Exception, match="picks the decode dtype itself"):
        view.load_vae(VaeRequest(nn.Identity, Path(), device=CPU, decode_dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="a bug inside the load"):
        view.load_vae(VaeRequest(nn.Identity, Path(), device=CPU))


def test_a_loader_without_a_runtime_device_setting_skips_only_the_cpu_runtime_cases() -> None:
    class NoSetting:
        runtime_device_setting = False

    with pytest.raises(pytest.skip.Exception, match="no runtime-device setting"):
        skip_cpu_runtime_without_the_setting(NoSetting(), torch.device("cpu", 0))
    skip_cpu_runtime_without_the_setting(NoSetting(), torch.device("cuda"))
    skip_cpu_runtime_without_the_setting(object(), torch.device("cpu"))  # absent means it has one


LOGS_A_PATH = """
import logging
import pytest
from reference.kit.seam import PLANS

@pytest.mark.rule("PLAN-1")
@pytest.mark.capability(PLANS)
def test_logs_a_path_that_is_not_utf8(loader):
    path = b"/tmp/ckpt-\\xff".decode("utf-8", "surrogateescape")
    logging.getLogger("a-loader").warning("reading %s", path)
    assert False, "fails, so its captured log is reported"
"""


@pytest.mark.long
def test_a_logged_path_that_is_not_utf8_reaches_the_report_from_a_worker(
    kit: pytest.Pytester,
) -> None:
    """A loader may log a path that is not UTF-8 (a lone surrogate): its captured log must
    not stop a pytest-xdist worker from sending the report back."""
    pytest.importorskip("xdist")
    kit.makepyfile(test_logs=LOGS_A_PATH)
    path = kit.path / "report.json"
    result = run(
        kit,
        "-p",
        "xdist",
        "-n",
        "1",
        "--loader=tinyloaders:Good",
        f"--conformance-report={path}",
        "test_logs.py",
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(failed=1)
    assert json.loads(path.read_text())["rules"]["PLAN-1"]["status"] == "failed"
