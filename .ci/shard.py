"""A pytest plugin for .ci/bare-venv.sh: `-p shard --shard=K/N` keeps every Nth collected test,
starting from the Kth (0-based), and deselects the rest.

The bare venv has no pytest-xdist, so its tier runs as two processes on the machine's two cores.
Split by file, one process drew the hostile corpus, the pipelines and the benchmark's tests (44 s
against 21 s); taken test by test, every file's tests go to both halves alike.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, help="K/N: keep every Nth test from the Kth")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("shard")
    if shard is None:
        return
    index, count = (int(part) for part in shard.split("/"))
    kept = [item for i, item in enumerate(items) if i % count == index]
    dropped = [item for i, item in enumerate(items) if i % count != index]
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept
