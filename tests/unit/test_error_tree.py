"""One error tree: the loader raises on purpose only `LoadError`s, the kit only `KitError`s.

A bare `ValueError` beside the documented types reads, to a caller, like a bug; so does a kit
failure that cannot be told from a loader's refusal. These tests read the source, so a new bare
raise fails here before a user meets it.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

import pytest

import reference
import reference.errors
import reference.kit.conform
import reference.kit.expectations
import reference.kit.failures
import reference.kit.matrix
import reference.kit.selection
from reference.errors import LoadError
from reference.kit.errors import KitError

pytestmark = pytest.mark.internal

PACKAGE = Path(reference.__file__).parent
# Mapping-style lookups raise KeyError as a mapping does (RULES["XX-1"]).
ALLOWED = {("rules.py", "KeyError")}


def loader_files() -> list[Path]:
    return sorted(PACKAGE.glob("*.py"))


def bare_raises(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = func.id if isinstance(func, ast.Name) else None
            builtin = isinstance(getattr(builtins, name or "", None), type)
            if builtin and (path.name, name) not in ALLOWED:
                found.append(f"{path.name}:{node.lineno}: raise {name}(...)")
    return found


@pytest.mark.parametrize("path", loader_files(), ids=lambda p: p.name)
def test_the_loader_raises_no_bare_builtin_error(path: Path) -> None:
    assert bare_raises(path) == [], "raise a reference.errors type (a LoadError) instead"


def test_every_loader_error_is_a_load_error() -> None:
    classes = [c for _, c in inspect.getmembers(reference.errors, inspect.isclass)]
    errors = [
        c for c in classes if issubclass(c, BaseException) and c.__module__ == "reference.errors"
    ]
    assert errors
    assert all(issubclass(c, LoadError) for c in errors)


@pytest.mark.parametrize(
    "module",
    [
        reference.kit.conform,
        reference.kit.expectations,
        reference.kit.failures,
        reference.kit.matrix,
        reference.kit.selection,
    ],
    ids=lambda m: m.__name__,
)
def test_every_kit_error_is_a_kit_error(module: object) -> None:
    errors = [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if issubclass(c, Exception) and c.__module__ == getattr(module, "__name__", None)
    ]
    assert errors
    assert all(issubclass(c, KitError) for c in errors)
