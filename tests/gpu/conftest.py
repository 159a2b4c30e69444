"""The GPU tier's own fixtures: a CUDA runtime device or a failure, and the figures a run records.

tests/gpu checks what only a real device shows, on real CUDA (no fake platform). Run on any other
runtime device, every test here errors at setup instead of passing or skipping: a GPU tier that
skipped everything would look green without having checked anything.

Tests record their measured figures (peak device memory, host memory growth) with the
`gpu_figures` fixture; the run prints them at the end, in a "gpu tier figures" section.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch

FIGURES = pytest.StashKey[list[str]]()
Record = Callable[..., None]
TP_TEST = "tests/unit/test_tp.py::test_tp2_over_torch_distributed"


@pytest.fixture(autouse=True)
def gpu_device(runtime_device: torch.device) -> torch.device:
    """The CUDA runtime device; any other runtime device fails the test (never skips it)."""
    if runtime_device.type != "cuda":
        pytest.fail(
            f"tests/gpu is the GPU tier and needs --runtime-device=cuda, got {runtime_device};"
            " run `tox -e gpu` (or .ci/gpu-check.sh) on a CUDA machine, or `tox -e unit` here",
            pytrace=False,
        )
    return runtime_device


def mib(n: float) -> str:
    return f"{n / 1024**2:.1f} MiB"


@pytest.fixture
def gpu_figures(
    request: pytest.FixtureRequest, record_property: Callable[[str, object], None]
) -> Record:
    """`record(label, sizes, note="")`: keep measured byte counts for the run's summary.

    The line ("label: name 12.0 MiB, ...; note") also goes to the JUnit XML as a property.
    """
    figures = request.config.stash.setdefault(FIGURES, [])

    def record(label: str, sizes: Mapping[str, int], note: str = "") -> None:
        text = ", ".join(f"{name} {mib(n)}" for name, n in sizes.items())
        line = f"{label}: {text}" + (f"; {note}" if note else "")
        figures.append(line)
        record_property(label, line)

    return record


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The figures block, printed on every CUDA run: also when tests failed or were stopped,
    since what a failing test measured before its assertion is the figure that explains it."""
    if torch.device(config.getoption("--runtime-device")).type != "cuda":
        return
    figures = config.stash.get(FIGURES, [])
    reports = [
        report
        for outcome in ("passed", "failed", "skipped", "error")
        for report in terminalreporter.stats.get(outcome, [])
        if isinstance(getattr(report, "nodeid", None), str)
    ]
    terminalreporter.section("gpu tier figures")
    for line in figures:
        terminalreporter.write_line(line)
    if not figures:
        terminalreporter.write_line("no figures recorded: no GPU test got as far as measuring")
    failed = sorted({r.nodeid for r in reports if r.failed and r.nodeid.startswith("tests/gpu")})
    for nodeid in failed:
        terminalreporter.write_line(f"FAILED {nodeid} (figures above are what it measured)")
    for report in (r for r in reports if r.nodeid == TP_TEST):
        if report.skipped:
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            terminalreporter.write_line(f"TP=2 over nccl ({TP_TEST}): skipped: {reason}")
        elif report.when == "call" or report.failed:
            terminalreporter.write_line(f"TP=2 over nccl ({TP_TEST}): {report.outcome}")
