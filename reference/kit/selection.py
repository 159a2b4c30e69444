"""Which loader the suite judges: `--loader=SPEC`, else `$LOADER_UNDER_TEST`; there is no default.

A SPEC is either `package.module:attr` (`attr` may be dotted) or the name of an entry point in
the group `diffusion_loader_conformance.adapters` (`reference` names the reference loader's own
adapter). What it names is an adapter object, an adapter class, or a zero-argument factory
returning an adapter. Whatever it is, the result must satisfy `reference.kit.seam.LoaderAdapter`:
a non-empty `name` and a non-empty frozenset `capabilities` drawn from `ALL_CAPABILITIES`. A SPEC
that does not resolve is an error, and so is a run that judges without any SPEC: the suite never
quietly judges the reference, or nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Literal, cast

from reference.kit.errors import KitError
from reference.kit.seam import ALL_CAPABILITIES, LoaderAdapter

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "HOW_TO_CHOOSE",
    "NO_LOADER",
    "OPTION",
    "REFERENCE",
    "REFERENCE_SPEC",
    "Selection",
    "SelectionError",
    "check_adapter",
    "resolve_spec",
    "select_adapter",
]

ENTRY_POINT_GROUP = "diffusion_loader_conformance.adapters"
ENV_VAR = "LOADER_UNDER_TEST"
OPTION = "--loader"
REFERENCE = "reference"
REFERENCE_SPEC = "reference.kit.adapters.reference:ReferenceAdapter"
"""`--loader=reference` names the reference's adapter, also where no entry point is installed
(a clone run without pip install, the GPU tier's bare environment)."""

HOW_TO_CHOOSE = (
    "Choose the loader under test in one of three ways:\n"
    f"  1. {OPTION}=package.module:attr  an adapter, an adapter class or a zero-argument factory\n"
    f"  2. {OPTION}=NAME                 an entry point in group '{ENTRY_POINT_GROUP}'"
    f" ({OPTION}=reference judges the reference loader)\n"
    f"  3. {ENV_VAR}=SPEC        either form, in the environment"
)


class SelectionError(KitError, ValueError):
    """The loader under test cannot be resolved, or what was found is not an adapter."""


@dataclass(frozen=True)
class Selection:
    """The loader under test and how it was chosen.

    Attributes:
        adapter: the adapter the `loader` fixture hands to contract tests.
        how: `option` (--loader) or `environment` ($LOADER_UNDER_TEST).
        spec: the SPEC it was resolved from.
    """

    adapter: LoaderAdapter
    how: Literal["option", "environment"]
    spec: str

    @property
    def source(self) -> str:
        """How it was chosen, in words, for the report header and the JSON report."""
        if self.how == "option":
            return f"chosen by {OPTION}={self.spec}"
        return f"chosen by {ENV_VAR}={self.spec}"


NO_LOADER = (
    f"no loader under test was chosen, and the suite judges none by default.\n{HOW_TO_CHOOSE}"
)


def select_adapter(*, option: str | None, environ: Mapping[str, str]) -> Selection | None:
    """Resolve the loader under test from the option, else the environment.

    Args:
        option: the value of `--loader`, or None when it was not given.
        environ: the environment; an empty `LOADER_UNDER_TEST` counts as unset.

    Returns:
        The adapter and a line saying how it was chosen; None when nothing chose one (a run
        that then collects a contract test is a usage error, NO_LOADER).

    Raises:
        SelectionError: the SPEC does not resolve to an adapter; the message names the SPEC,
            where it came from, what went wrong and the three ways to choose a loader.
    """
    if option is not None:
        return Selection(resolve_spec(option, origin=OPTION), "option", option)
    spec = environ.get(ENV_VAR, "")
    if spec:
        return Selection(resolve_spec(spec, origin=ENV_VAR), "environment", spec)
    return None


def resolve_spec(spec: str, *, origin: str) -> LoaderAdapter:
    """The adapter a SPEC names (see the module docstring).

    Args:
        spec: `package.module:attr` or an entry point name.
        origin: where the SPEC came from (`--loader` or the variable), for the message.

    Raises:
        SelectionError: naming the SPEC, its origin and the cause, followed by HOW_TO_CHOOSE.
    """
    try:
        target = _load_target(spec.strip())
        return check_adapter(_instantiate(target))
    except SelectionError as error:
        raise SelectionError(
            f"cannot use loader {spec!r} (from {origin}): {error}\n{HOW_TO_CHOOSE}"
        ) from None


def check_adapter(candidate: object) -> LoaderAdapter:
    """Return `candidate` typed as an adapter once its name and capabilities are valid.

    Methods are not checked here: a method of an undeclared capability is never called, and a
    missing method of a declared one fails the tests that need it.

    Raises:
        SelectionError: `name` is not a non-empty str, or `capabilities` is not a non-empty
            frozenset of known capability names (the message lists the known ones).
    """
    what = f"it names a {type(candidate).__name__}"
    name = getattr(candidate, "name", None)
    if not isinstance(name, str) or not name:
        raise SelectionError(f"{what}, which has no non-empty str attribute 'name'")
    capabilities = getattr(candidate, "capabilities", None)
    known = ", ".join(sorted(ALL_CAPABILITIES))
    if not isinstance(capabilities, frozenset):
        raise SelectionError(
            f"{what}, whose 'capabilities' is {type(capabilities).__name__}, not a frozenset "
            f"of capability names ({known})"
        )
    unknown = sorted(str(c) for c in capabilities - ALL_CAPABILITIES)
    if unknown:
        raise SelectionError(
            f"adapter {name!r} declares unknown capabilities {', '.join(unknown)}; known: {known}"
        )
    if not capabilities:
        raise SelectionError(
            f"adapter {name!r} declares no capability, so every contract test would be skipped; "
            f"declare what it implements ({known})"
        )
    return cast(LoaderAdapter, candidate)


def _load_target(spec: str) -> object:
    if spec == REFERENCE:
        spec = REFERENCE_SPEC
    if ":" not in spec:
        return _load_entry_point(spec)
    module_name, _, attr_path = spec.partition(":")
    if not module_name or not attr_path:
        raise SelectionError("expected package.module:attr with both parts non-empty")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as error:
        raise SelectionError(
            f"cannot import module {module_name!r} ({error}); is it installed or on PYTHONPATH?"
        ) from None
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise SelectionError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return target


def _load_entry_point(name: str) -> object:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    matches = [ep for ep in found if ep.name == name]
    if not matches:
        installed = ", ".join(sorted({ep.name for ep in found})) or "none"
        raise SelectionError(
            f"no entry point named {name!r} in group {ENTRY_POINT_GROUP!r} (installed: "
            f"{installed}); for an object in a module write package.module:attr"
        )
    try:
        return matches[0].load()
    except Exception as error:
        raise SelectionError(
            f"entry point {name!r} ({matches[0].value}) failed to load: "
            f"{type(error).__name__}: {error}"
        ) from None


def _instantiate(target: object) -> object:
    # A class carries `name` and `capabilities` as class attributes, so it would pass for an
    # adapter object: classes are always instantiated.
    looks_like_adapter = hasattr(target, "name") and hasattr(target, "capabilities")
    if not callable(target) or (looks_like_adapter and not isinstance(target, type)):
        return target
    try:
        return target()
    except Exception as error:
        raise SelectionError(
            f"calling it with no arguments raised {type(error).__name__}: {error}"
        ) from None
