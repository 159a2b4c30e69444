"""The suite's pytest plugin: loader under test, expectations, runtime device, rules, the report.

Loaded only when asked, so it costs nothing in any other pytest run of the environment:
`python -m reference conform` passes `-p reference.kit.plugin`, a clone's `tests/conftest.py`
names it, and a run of the installed suite under one's own configuration adds
`-p reference.kit.plugin` (no `pytest11` entry point). Options: `--loader=SPEC` (else
$LOADER_UNDER_TEST; there is no default: a run that collects a contract test without one is a
usage error; see reference.kit.selection), `--expectations=FILE` (see
reference.kit.expectations), `--runtime-device`, `--conformance-report`. Fixtures: `loader`,
`runtime_device`, `conformance`, `offload_plan`, `known_rules`.

The seam is enforced: the `loader` fixture lets a test call only the methods of the capabilities
it is marked with (reference.kit.seam.METHODS). A call outside them is a defect of the suite, not
of the loader: the test fails naming it, and no rule is blamed. A failed contract test is
reported on one line, rules first (`reference.kit.failures`), and the JSON report keeps that
line for each failing test of a rule.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from reference.kit.adapters.reference import ReferenceAdapter
from reference.kit.conformance import (
    Outcome,
    TestOutcome,
    build_report,
    summary_lines,
    unexpected_passes,
)
from reference.kit.expectations import (
    Expectations,
    ExpectationsError,
    expected_reason,
    read_expectations,
)
from reference.kit.failures import SeamView, SeamViolation, one_line, printable
from reference.kit.isolated import Attempt, attempt, attempt_with
from reference.kit.seam import METHODS, LoaderAdapter, Plan, PlanLike, SeamLoader
from reference.kit.selection import (
    ENV_VAR,
    NO_LOADER,
    REFERENCE,
    Selection,
    SelectionError,
    select_adapter,
)
from reference.request import platform
from reference.rules import BY_ID

__all__ = [
    "DEFECT_PROPERTY",
    "INTERNAL_PROPERTY",
    "MARKERS",
    "NO_LOADER_OUTPUT",
    "REASON_PROPERTY",
    "RULES_PROPERTY",
    "Conformance",
    "conformance",
    "isolated",
    "isolated_with",
    "known_rules",
    "loader",
    "offload_plan",
    "pytest_addoption",
    "pytest_assertrepr_compare",
    "pytest_configure",
    "runtime_device",
]

RULES_PROPERTY = "conformance_rules"  # how an xdist worker tells the controller a test's rules
REASON_PROPERTY = "conformance_reason"  # ... and a failure's one line
DEFECT_PROPERTY = "conformance_suite_defect"  # ... and a defect of the suite itself
INTERNAL_PROPERTY = "conformance_internal"  # ... and that the test is one of the suite's own
NO_LOADER_OUTPUT = "conformance_no_loader"  # a worker's word that it collected tests to judge
OPT_IN = ("selftest", "long")
"""Markers of the tests a run without `-m` leaves out (`-m "selftest or long"` runs them)."""
MARKERS = (
    "rule(*ids): the rule IDs of the contract (reference/rules.py) that this test pins",
    "internal: a test of the suite's own machinery; names no contract rule",
    "selftest: a long run of the suite against loaders it must fail (tox -e selftest)",
    "long: a test of the suite's own programs that takes seconds (the benchmark end to end,"
    " distributed runs of the kit); with selftest, left out unless -m names it",
    "capability(name): the adapter capability this test needs; skipped when the loader under"
    " test does not declare it",
    "reference_only(why): judges the reference alone (its wording, reasons or internals); runs"
    " only when the loader under test is exactly ReferenceAdapter, and counts toward no rule"
    " of another loader",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance")
    group.addoption(
        "--runtime-device",
        default="cpu",
        help="device the contract tests load onto: cpu (unit tier) or cuda (gpu tier)",
    )
    group.addoption(
        "--conformance-report",
        metavar="PATH",
        default=None,
        help="write the per-rule JSON report (schema loader-conformance/1) to PATH",
    )
    group.addoption(
        "--loader",
        metavar="SPEC",
        default=None,
        help=f"the loader under test: package.module:attr or an entry point name ({REFERENCE}:"
        f" the reference loader); else ${ENV_VAR}; required to run contract tests",
    )
    group.addoption(
        "--expectations",
        metavar="FILE",
        default=None,
        help="rules the loader under test is expected to fail ('RULE-ID [@device]: reason' lines)",
    )


class Conformance:
    """Holds the loader under test and turns test reports into per-rule outcomes."""

    def __init__(
        self,
        config: pytest.Config,
        selection: Selection | None,
        expectations: Expectations | None,
    ) -> None:
        self.config = config
        self.selection = selection
        self.source = selection.source if selection else "none chosen"
        self.expectations = expectations
        self.device = str(config.getoption("--runtime-device"))
        self.expected = expectations.for_device(self.device) if expectations else {}
        self.rules: dict[str, tuple[str, ...]] = {}
        self.capabilities: dict[str, frozenset[str]] = {}
        self.internal: set[str] = set()  # selected tests of the suite's own machinery
        self.outcomes: dict[str, TestOutcome] = {}
        self.problems: list[str] = []
        self.aborted = False  # no report for a run refused before any test ran
        self.workers_without_loader = False
        # Under pytest-xdist, workers collect and run; the controller only sees their reports,
        # which carry each test's rules (see pytest_runtest_makereport).
        self.worker = hasattr(config, "workerinput")

    @property
    def adapter(self) -> LoaderAdapter:
        """The loader under test.

        Raises:
            pytest.UsageError: none was chosen (NO_LOADER).
        """
        if self.selection is None:
            raise pytest.UsageError(NO_LOADER)
        return self.selection.adapter

    @property
    def name(self) -> str:
        return self.selection.adapter.name if self.selection else "(none)"

    @property
    def declared(self) -> frozenset[str]:
        return self.selection.adapter.capabilities if self.selection else frozenset()

    def pytest_report_header(self) -> list[str]:
        if self.expectations is None:
            expectations = "none (declare known failures with --expectations=FILE)"
        else:
            here = ", ".join(sorted(self.expected)) or "none"
            expectations = (
                f"{self.expectations.source}: {len(self.expectations.entries)} entries; "
                f"expected to fail on {self.device}: {here}"
            )
        return [
            f"loader under test: {self.name}, {self.source}",
            f"capabilities: {', '.join(sorted(self.declared)) or 'none'}",
            f"expectations: {expectations}",
            f"runtime device: {self.device}; {platform.describe()}",
        ]

    @property
    def controller(self) -> bool:
        """Whether this process is pytest-xdist's controller (xdist registers it after us)."""
        return self.config.pluginmanager.hasplugin("dsession")

    @property
    def judges_reference(self) -> bool:
        """Whether the loader under test is the reference itself (not a subclass or wrapper)."""
        return self.selection is not None and type(self.selection.adapter) is ReferenceAdapter

    @pytest.hookimpl(trylast=True)  # after -k / -m / --deselect chose the items
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        named = any("::" in str(arg) for arg in config.args)
        if not config.getoption("markexpr") and not named:
            # The suite tested at length is `tox -e selftest`'s (`-m "selftest or long"`): a
            # plain run is the contract tests and the quick tests of the kit. A test asked for
            # by its node id runs whatever its markers.
            opted = [i for i in items if any(i.get_closest_marker(m) for m in OPT_IN)]
            if opted:
                config.hook.pytest_deselected(items=opted)
                left = set(items) - set(opted)
                items[:] = [item for item in items if item in left]
        for item in items:
            rules = tuple(i for m in item.iter_markers("rule") for i in m.args)
            if item.get_closest_marker("reference_only") and not self.judges_reference:
                rules = ()  # it cannot judge this loader: it credits and blames nothing
            self.rules[item.nodeid] = rules
            self.capabilities[item.nodeid] = frozenset(
                c for m in item.iter_markers("capability") for c in m.args
            )
            if item.get_closest_marker("internal"):
                self.internal.add(item.nodeid)
        contract = [item for item in items if self.rules.get(item.nodeid)]
        if self.selection is None and contract:
            if not self.worker:
                self.aborted = True
                raise pytest.UsageError(NO_LOADER)
            # A worker cannot stop the run: it runs nothing and tells the controller why.
            config.hook.pytest_deselected(items=list(items))
            items.clear()
            config.workeroutput[NO_LOADER_OUTPUT] = True  # type: ignore[attr-defined]

    @pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without xdist
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        if getattr(node, "workeroutput", {}).get(NO_LOADER_OUTPUT):
            self.workers_without_loader = True

    def judges_nothing(self, rules: Iterable[tuple[str, ...]]) -> bool:
        """No contract test was selected, and the run is not one of the suite's own tests
        alone (the selftest tier), or it was asked for a report: a -k / -m / --deselect or a
        path that left out what the run meant to judge."""
        if any(rules):
            return False
        return not self.internal or bool(self.config.getoption("--conformance-report"))

    def nothing_to_judge(self, selected: int) -> str:
        return (
            f"no contract test was collected ({selected} test(s) selected, none names a rule),"
            f" so {self.name!r} cannot be judged. Point pytest at the suite (tests/unit,"
            " tests/gpu) and check -k / -m / --deselect."
        )

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.selection is None or session.testsfailed or self.worker:
            return  # collection errors are reported by pytest itself; xdist: the controller
        if self.judges_nothing(self.rules.get(item.nodeid, ()) for item in session.items):
            self.aborted = True
            raise pytest.UsageError(self.nothing_to_judge(len(session.items)))

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        only = item.get_closest_marker("reference_only")
        if only is not None and not self.judges_reference:
            why = only.args[0] if only.args else "it checks the reference's own code"
            pytest.skip(f"judges the reference alone: {why}")
        for marker in item.iter_markers("capability"):
            for capability in marker.args:
                if capability not in self.declared:
                    pytest.skip(f"loader {self.name!r} does not declare capability {capability!r}")

    def view_for(self, nodeid: str) -> SeamLoader:
        """The loader as the test `nodeid` may reach it: its capabilities' methods only."""
        marked = self.capabilities.get(nodeid, frozenset())
        allowed = frozenset().union(*(METHODS[c] for c in marked if c in METHODS))
        return cast(SeamLoader, SeamView(self.adapter, allowed=allowed, marked=marked))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        rules = self.rules.get(item.nodeid, ())
        defect = call.excinfo is not None and call.excinfo.errisinstance(SeamViolation)
        if defect:
            assert call.excinfo is not None
            rules = ()  # the suite's defect blames no rule of the loader
            report.user_properties.append((DEFECT_PROPERTY, str(call.excinfo.value)))
        reason = ""
        if report.failed and call.excinfo is not None and not defect:
            reason = one_line(item, rules, call.excinfo)
            if rules and self.config.getoption("tbstyle") == "auto":
                report.longrepr = reason  # one line, rule first; --tb=long shows pytest's own
        if report.longrepr is not None and not isinstance(report.longrepr, str):
            text = str(report.longrepr)
            shown = printable(text)
            if shown != text:  # a path that is not UTF-8 would break the report
                report.longrepr = shown
        # The captured output and logs as well: a loader that logs such a path would stop a
        # pytest-xdist worker from sending its report back.
        report.sections = [(title, printable(content)) for title, content in report.sections]
        if self.worker:
            report.user_properties.append((RULES_PROPERTY, rules))
            report.user_properties.append((REASON_PROPERTY, reason))
            if item.nodeid in self.internal:
                report.user_properties.append((INTERNAL_PROPERTY, True))
        elif defect:
            self.rules[item.nodeid] = ()
        expected = expected_reason(rules, self.expected)
        if report.failed and expected is not None:
            # What pytest's own xfail does: the failure stays in longrepr, the outcome changes.
            report.outcome = "skipped"
            report.wasxfail = f"expected: {expected}"
        elif reason:
            report.conformance_reason = reason  # type: ignore[attr-defined]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        previous = self.outcomes.get(report.nodeid)
        if previous is not None and previous.outcome == "failed":
            return
        properties = dict(report.user_properties)
        defect = properties.get(DEFECT_PROPERTY)
        if defect is not None and report.failed:
            self.problems.append(f"SUITE DEFECT: {report.nodeid}: {defect}")
        outcome: Outcome
        reason = ""
        if report.failed:
            outcome = "failed"
            reason = str(
                properties.get(REASON_PROPERTY) or getattr(report, "conformance_reason", "")
            ) or (f"{report.when} failed")
        elif report.skipped and hasattr(report, "wasxfail"):
            outcome, reason = "xfailed", str(report.wasxfail)
        elif report.skipped:
            longrepr = report.longrepr
            text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            outcome, reason = "skipped", text.removeprefix("Skipped: ")
        elif report.when == "call":
            outcome = "passed"
        else:
            return
        rules = self.rules.get(report.nodeid, ())
        if self.controller:
            carried = properties.get(RULES_PROPERTY, ())
            rules = tuple(str(rule) for rule in cast("Iterable[object]", carried))
        if defect is not None:
            rules = ()
        if properties.get(INTERNAL_PROPERTY):
            self.internal.add(report.nodeid)
        self.outcomes[report.nodeid] = TestOutcome(report.nodeid, rules, outcome, reason)

    def report(self) -> dict[str, Any]:
        return build_report(
            loader_name=self.name,
            loader_source=self.source,
            capabilities=self.declared,
            device=self.device,
            outcomes=self.outcomes.values(),
            expected=self.expected,
            expectations_source=self.expectations.source if self.expectations else None,
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.aborted or self.worker:
            return
        if session.exitstatus == pytest.ExitCode.INTERRUPTED:
            return  # a Ctrl-C: pytest's own summary says what ran; no diagnosis to add
        if self.controller and self.workers_without_loader:
            self.aborted = True  # what pytest_collection_modifyitems does without xdist
            session.config.get_terminal_writer().line(f"ERROR: {NO_LOADER}", red=True)
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        judging = self.selection is not None
        if (
            self.controller
            and judging
            and self.judges_nothing(o.rules for o in self.outcomes.values())
        ):
            self.aborted = True  # what pytest_collection_finish does without xdist
            session.config.get_terminal_writer().line(
                f"ERROR: {self.nothing_to_judge(len(self.outcomes))}", red=True
            )
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        passed_instead = unexpected_passes(self.report())
        if passed_instead and self.expectations is not None:
            self.problems.append(
                f"FAILED: expected to fail but passed: {', '.join(passed_instead)}; if the bug is"
                f" fixed, remove them from {self.expectations.source}"
            )
        contract = [o for o in self.outcomes.values() if o.rules]
        if judging and contract and all(o.outcome == "skipped" for o in contract):
            self.problems.append(
                f"FAILED: no contract test ran: every one was skipped or deselected, so "
                f"{self.name!r} was not judged (capabilities: "
                f"{', '.join(sorted(self.declared))})"
            )
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.aborted or self.worker or self.selection is None:
            return
        if not any(o.rules for o in self.outcomes.values()) and not self.problems:
            return  # a run of other tests (the installed plugin loads into every pytest run)
        report = self.report()
        terminalreporter.section("conformance")
        for line in summary_lines(report):
            terminalreporter.write_line(line)
        for line in self.problems:
            terminalreporter.write_line(line, red=True, bold=True)
        path = self.config.getoption("--conformance-report")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(report, indent=2) + "\n")
            terminalreporter.write_line(f"conformance report written to {path}")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    device = torch.device(config.getoption("--runtime-device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            "the GPU tier needs a visible CUDA device and found none ("
            + platform.describe()
            + "). Run it on a CUDA machine with a CUDA build of torch, or run the CPU tier:"
            " tox -e unit"
        )
    try:
        selection = select_adapter(option=config.getoption("--loader"), environ=os.environ)
        path = config.getoption("--expectations")
        expectations = read_expectations(path) if path else None
    except (SelectionError, ExpectationsError) as error:
        raise pytest.UsageError(str(error)) from None
    if selection is None and (expectations or config.getoption("--conformance-report")):
        # A report or expectations only make sense of a loader: say so before anything runs.
        raise pytest.UsageError(NO_LOADER)
    config.pluginmanager.register(Conformance(config, selection, expectations), "conformance")


def pytest_assertrepr_compare(op: str, left: object, right: object) -> list[str] | None:
    """Tensors compared in an assertion are summarised (dtype, shape, device, first difference),
    never printed whole."""
    if not (isinstance(left, torch.Tensor) or isinstance(right, torch.Tensor)):
        return None
    from reference.kit.failures import describe, first_difference

    lines = [f"{describe(left)} {op} {describe(right)}"]
    difference = first_difference(left, right)
    if difference:
        lines.append(difference)
    return lines


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    plugin = request.config.pluginmanager.get_plugin("conformance")
    assert isinstance(plugin, Conformance)
    return plugin


@pytest.fixture
def loader(conformance: Conformance, request: pytest.FixtureRequest) -> SeamLoader:
    """The loader under test, reachable through the methods of the test's capabilities only."""
    return conformance.view_for(request.node.nodeid)


@pytest.fixture
def isolated(conformance: Conformance, request: pytest.FixtureRequest) -> Callable[..., Attempt]:
    """`isolated(method, *args, **kwargs)`: the call, made on the loader under test in a fresh
    process that a deadline can kill (reference.kit.isolated), for attempts that can block."""
    selection = conformance.selection
    if selection is None:
        raise pytest.UsageError(NO_LOADER)
    marked = conformance.capabilities.get(request.node.nodeid, frozenset())
    return functools.partial(attempt, selection.spec, marked)


@pytest.fixture
def isolated_with(
    conformance: Conformance, request: pytest.FixtureRequest
) -> Callable[..., Attempt]:
    """`isolated_with(function, *args, **kwargs)`: `function(loader, *args, **kwargs)` in a
    fresh process that a deadline can kill, `loader` being the loader under test seen through
    the test's capabilities (reference.kit.isolated.attempt_with); the attempt reports its
    peak memory too."""
    selection = conformance.selection
    if selection is None:
        raise pytest.UsageError(NO_LOADER)
    marked = conformance.capabilities.get(request.node.nodeid, frozenset())
    return functools.partial(attempt_with, selection.spec, marked)


@pytest.fixture
def runtime_device(conformance: Conformance) -> torch.device:
    """The device contract tests load onto: cpu in the unit tier, cuda in the gpu tier."""
    return torch.device(conformance.device)


@pytest.fixture
def offload_plan() -> PlanLike:
    """The plan of an unquantized, CPU-offloaded DiT (DEV-1, PLAN-2): it loads on CPU, where
    adoption happens. A value of the suite's own (reference.kit.seam.Plan), so a test of another
    capability never needs the loader's plan methods."""
    return Plan(checkpoint_load_device=torch.device("cpu"))


@pytest.fixture
def known_rules() -> frozenset[str]:
    return frozenset(BY_ID)
