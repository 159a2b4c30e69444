"""The suite's pytest plugin: loader under test, runtime device, rule markers, the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from reference import platform
from reference.adapter import LoaderAdapter, ReferenceAdapter
from reference.conformance import Outcome, TestOutcome, build_report, summary_lines
from reference.rules import BY_ID


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


class Conformance:
    """Holds the loader under test and turns test reports into per-rule outcomes."""

    def __init__(self, config: pytest.Config, adapter: LoaderAdapter, source: str) -> None:
        self.config = config
        self.adapter = adapter
        self.source = source
        self.device = str(config.getoption("--runtime-device"))
        self.rules: dict[str, tuple[str, ...]] = {}
        self.outcomes: dict[str, TestOutcome] = {}

    def pytest_report_header(self) -> list[str]:
        return [
            f"loader under test: {self.adapter.name} ({self.source})",
            f"capabilities: {', '.join(sorted(self.adapter.capabilities)) or 'none'}",
            f"runtime device: {self.device}; {platform.describe()}",
        ]

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.rules[item.nodeid] = tuple(i for m in item.iter_markers("rule") for i in m.args)

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        for marker in item.iter_markers("capability"):
            for capability in marker.args:
                if capability not in self.adapter.capabilities:
                    pytest.skip(
                        f"loader {self.adapter.name!r} does not declare capability {capability!r}"
                    )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        previous = self.outcomes.get(report.nodeid)
        if previous is not None and previous.outcome == "failed":
            return
        outcome: Outcome
        reason = ""
        if report.failed:
            outcome, reason = "failed", f"{report.when} failed"
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
        self.outcomes[report.nodeid] = TestOutcome(report.nodeid, rules, outcome, reason)

    def report(self) -> dict[str, Any]:
        return build_report(
            loader_name=self.adapter.name,
            loader_source=self.source,
            capabilities=self.adapter.capabilities,
            device=self.device,
            outcomes=self.outcomes.values(),
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        report = self.report()
        terminalreporter.section("conformance")
        for line in summary_lines(report):
            terminalreporter.write_line(line)
        path = self.config.getoption("--conformance-report")
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(report, indent=2) + "\n")
            terminalreporter.write_line(f"conformance report written to {path}")


def pytest_configure(config: pytest.Config) -> None:
    device = torch.device(config.getoption("--runtime-device"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            "the GPU tier needs a visible CUDA device and found none ("
            + platform.describe()
            + "). Run it on a CUDA machine with a CUDA build of torch, or run the CPU tier:"
            " tox -e unit"
        )
    plugin = Conformance(config, ReferenceAdapter(), "default (the reference adapter)")
    config.pluginmanager.register(plugin, "conformance")


@pytest.fixture
def conformance(request: pytest.FixtureRequest) -> Conformance:
    plugin = request.config.pluginmanager.get_plugin("conformance")
    assert isinstance(plugin, Conformance)
    return plugin


@pytest.fixture
def loader(conformance: Conformance) -> LoaderAdapter:
    """The loader under test (the reference adapter unless another is selected)."""
    return conformance.adapter


@pytest.fixture
def runtime_device(conformance: Conformance) -> torch.device:
    """The device contract tests load onto: cpu in the unit tier, cuda in the gpu tier."""
    return torch.device(conformance.device)


@pytest.fixture
def known_rules() -> frozenset[str]:
    return frozenset(BY_ID)
