"""House rules read off the source, so a breach fails here before a user meets it.

  * One error tree: the loader raises on purpose only `LoadError`s, the kit only `KitError`s (a
    bare `ValueError` beside the documented types reads, to a caller, like a bug).
  * Every module states its public surface in `__all__`, and every name there exists.
  * No broken loader patches another module: each passes its defect through the reference's
    step values (`DiTSteps`, `VAESteps`), so a renamed step cannot silently disarm it.
(The import graph, one way and without cycles, is the lint tier's: .ci/import_graph.py.)
"""

from __future__ import annotations

import ast
import builtins
import importlib
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


FAKES = Path(importlib.import_module("fakes").__file__ or "").parent


def modules() -> list[str]:
    """Every module of the package and of the fakes beside it, by import name."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "suite" in parts:
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    for path in sorted(FAKES.rglob("*.py")):
        parts = path.relative_to(FAKES.parent).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(set(names))


OPTIONAL = ("reference.kit.adapters.sglang", "reference.kit.adapters._torchvision_shim")
# Packages some modules need that an environment may lack (the GPU tier's bare venv).
EXTRAS = {"hypothesis", "diffusers", "transformers", "accelerate", "matplotlib", "tqdm"}


def declares_all_in_source(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    assert spec is not None
    assert spec.origin is not None
    return "\n__all__" in Path(spec.origin).read_text()


@pytest.mark.parametrize("name", modules())
def test_every_module_declares_its_public_names(name: str) -> None:
    if name in OPTIONAL:  # import sglang or torchvision: read, not imported
        assert declares_all_in_source(name)
        return
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as missing:
        if missing.name not in EXTRAS:
            raise
        assert declares_all_in_source(name)
        return
    assert isinstance(getattr(module, "__all__", None), list), f"{name} has no __all__"
    missing = [n for n in module.__all__ if not hasattr(module, n)]
    assert missing == [], f"{name}.__all__ names what it does not define"


def patches(path: Path) -> list[str]:
    """Assignments to an imported module's attributes, and setattr calls, in `path`."""
    tree = ast.parse(path.read_text())
    modules_here = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name[:1].islower()  # `from reference import adopt`: a module
    }
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id in modules_here
            ):
                found.append(f"{path.name}:{node.lineno}: {target.value.id}.{target.attr} = ...")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            found.append(f"{path.name}:{node.lineno}: setattr(...)")
    return found


@pytest.mark.parametrize("path", sorted((FAKES / "broken").glob("*.py")), ids=lambda p: p.name)
def test_no_broken_loader_patches_another_module(path: Path) -> None:
    assert patches(path) == [], "pass the defect as a step (reference.load.dit.DiTSteps, ...)"
