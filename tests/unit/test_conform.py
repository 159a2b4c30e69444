"""`python -m reference conform`: the installed contract tests, run against a loader, no clone.

The run here goes through `reference.__main__.main`, in this process, over the suite as the
package `reference.kit.suite` finds it (the editable install maps it onto tests/unit); the
wheel itself is installed and run from outside any clone by .ci/wheel-check.sh.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from pytest_mock import MockerFixture

from reference.__main__ import main
from reference.kit.conform import SUITE, SuiteNotInstalledError, suite_folder

pytestmark = pytest.mark.internal

# Two ZC-12 tests: plain `assign=True` loading keeps disjoint views adopted but unties tied
# parameters, so the run must fail ZC-12 for it.
SELECTION = "test_parameters_the_model_ties_stay_tied or test_disjoint_views_of_one_storage"


@pytest.fixture
def installed() -> Path:
    """The installed suite's folder; skips in a clone run without pip install."""
    if importlib.util.find_spec(SUITE) is None:
        pytest.skip(f"{SUITE} is not installed (a clone run without pip install)")
    return suite_folder()


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder whose own pytest configuration would break any run that read it."""
    work = tmp_path / "project"
    work.mkdir()
    (work / "pytest.ini").write_text("[pytest]\naddopts = --no-such-option\n")
    monkeypatch.chdir(work)
    return work


def test_conform_judges_the_selected_loader_and_writes_its_report(
    installed: Path, elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = elsewhere / "r.json"
    before = {path.name for path in installed.iterdir()}
    dont_write_bytecode = sys.dont_write_bytecode

    code = main(
        [
            "conform",
            "--loader=reference.kit.adapters.baselines:PlainAssign",
            f"--conformance-report={report_path}",
            "-k",
            SELECTION,
            "-p",
            "no:xdist",
        ]
    )

    assert code == pytest.ExitCode.TESTS_FAILED
    report = json.loads(report_path.read_text())
    assert report["loader"]["name"] == "plain-assign"
    assert report["rules"]["ZC-12"]["status"] == "failed"
    assert "conformance of plain-assign on cpu" in capsys.readouterr().out
    assert {path.name for path in installed.iterdir()} == before, "wrote into the installed suite"
    assert sys.dont_write_bytecode == dont_write_bytecode


@pytest.mark.usefixtures("installed")
def test_conform_runs_contract_tests_only(
    elsewhere: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "conform",
            "--loader=reference",
            "--collect-only",
            "-q",
            "-k",
            "test_kit or test_plan",
            "-p",
            "no:xdist",
        ]
    )

    assert code == pytest.ExitCode.OK
    collected = capsys.readouterr().out.splitlines()
    assert any("test_plan.py::" in line for line in collected)
    assert not any("test_kit.py::" in line for line in collected), "internal tests were selected"


def test_without_the_installed_suite_conform_says_how_to_get_it(
    mocker: MockerFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    mocker.patch("importlib.util.find_spec", return_value=None)

    with pytest.raises(SuiteNotInstalledError, match=r"pip install"):
        suite_folder()
    assert main(["conform", "--loader=reference"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ")
    assert SUITE in error
    assert "tests/unit" in error


@pytest.mark.usefixtures("installed")
def test_without_pytest_conform_names_the_extra_to_install(
    mocker: MockerFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    mocker.patch.dict(sys.modules, {"pytest": None})  # `import pytest` now raises ImportError

    assert main(["conform", "--loader=reference"]) == 2
    assert "[test]" in capsys.readouterr().err


def test_conform_help_names_the_loader_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--help"]) == 0
    assert "--loader" in capsys.readouterr().out


@pytest.mark.long  # a whole conform run in a child
@pytest.mark.usefixtures("installed")
def test_conform_writes_nothing_into_the_callers_folder_but_the_report(elsewhere: Path) -> None:
    """hypothesis keeps an example database, by default `.hypothesis/` in the working folder:
    conform runs it in a temporary folder, so only the report the caller asked for appears."""
    pytest.importorskip("hypothesis")
    code = main(
        [
            "conform",
            "--loader=reference.kit.adapters.reference:ReferenceAdapter",
            f"--conformance-report={elsewhere / 'r.json'}",
            "-k",
            "test_valid_checkpoints_read_back_bit_exactly",
            "-p",
            "no:xdist",
        ]
    )
    assert code == pytest.ExitCode.OK
    assert sorted(path.name for path in elsewhere.iterdir()) == ["pytest.ini", "r.json"]


@pytest.mark.usefixtures("installed")
def test_conform_without_a_loader_is_a_usage_error(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CI job that forgets --loader must go red, not judge the reference quietly."""
    monkeypatch.delenv("LOADER_UNDER_TEST", raising=False)
    assert main(["conform", "-p", "no:xdist", "-q"]) == pytest.ExitCode.USAGE_ERROR
    out = capsys.readouterr()
    assert "no loader under test was chosen" in out.out + out.err
    assert "--loader=" in out.out + out.err
