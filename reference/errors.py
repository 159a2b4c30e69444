"""Error types of the loading contract.

Every refusal is one of these, so callers (and the conformance suite) can tell a refused request
from a bug. Messages name the component, tensor, flag or file involved and say what to do.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

__all__ = [
    "LISTED",
    "ArgumentError",
    "CheckpointError",
    "ComponentCheckpointUnsupportedError",
    "ComponentLoadError",
    "DeviceMemoryError",
    "HostMemoryError",
    "LoadError",
    "PlanError",
    "QuantizationLoadError",
    "StateDictABIError",
    "StateMismatchError",
    "listed",
    "shown",
]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
LISTED = 8
"""How many names a message lists before it says how many more there are."""


def shown(text: str | os.PathLike[str] | bytes) -> str:
    """`text` (a path, a name) as one printable line: bytes that are not UTF-8 as `\\xNN`, and
    control characters (newline, NUL, ESC) escaped."""
    if isinstance(text, bytes):
        raw = text
    elif isinstance(text, os.PathLike):
        raw = os.fsencode(text)
    else:
        try:  # a name decoded from undecodable bytes gets them back
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate no decoding made: its escape
            raw = text.encode("utf-8", "backslashreplace")
    decoded = raw.decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", decoded)


def listed(names: Iterable[str], *, limit: int = LISTED) -> str:
    """Names for a message: each quoted and shown (`shown`), cut after `limit` with "and N
    more", so a header of a million names still makes a one-line message of bounded length."""
    names = list(names)
    head = ", ".join(f"'{shown(name)}'" for name in names[:limit])
    return head if len(names) <= limit else f"{head} and {len(names) - limit} more"


class LoadError(Exception):
    """Base of every error the reference loader raises on purpose."""


class PlanError(LoadError, ValueError):
    """A weight-load plan contradicts itself (PLAN-3)."""


class ComponentCheckpointUnsupportedError(LoadError, ValueError):
    """An explicit loading request that this loader cannot honour exactly (ADM-5).

    Raised before any fallback could run. Fallback paths must never catch it: an explicit request
    is honoured or refused, never silently downgraded.
    """


class CheckpointError(LoadError, ValueError):
    """A checkpoint file is missing, malformed, or disagrees with its index (CKPT-1..4).

    Attributes:
        file: the file at fault.
        entry: the tensor name (or header field) at fault, or None for the whole file.
    """

    def __init__(self, file: str, entry: str | None, problem: str) -> None:
        file, entry = shown(file), None if entry is None else shown(entry)
        where = f"{file}" if entry is None else f"{file} [{entry}]"
        super().__init__(f"{where}: {problem}")
        self.file = file
        self.entry = entry
        self.problem = problem


class ArgumentError(LoadError, ValueError):
    """Loading options that are malformed or cannot be honoured together (ARGS, DG-2, ADM-2)."""


class StateMismatchError(LoadError, ValueError):
    """Checkpoint tensors and the module's slots do not match (names, shapes, duplicates)."""


class StateDictABIError(LoadError, ValueError):
    """A module departs from the standard torch state-dict machinery (VAE-2, VAE-3, VAE-6)."""


class QuantizationLoadError(LoadError, RuntimeError):
    """Quantized loading was requested and failed; no unquantized fallback is attempted (FP8-5)."""


class DeviceMemoryError(LoadError, RuntimeError):
    """Direct loading would not fit in the device's free memory (DG-6)."""


class HostMemoryError(LoadError, MemoryError):
    """Constructing or loading a component would take more host memory than is available;
    refused before the allocation."""


class ComponentLoadError(LoadError, RuntimeError):
    """Something that is not a refusal failed inside one component's load: torch (a device
    that cannot be used, an allocation), the OS, or the model class's own code.

    Attributes:
        component: the component being loaded.
        cause: the original exception (also `__cause__`).
        folder: the component's folder, when known (its config.json and weights).
    """

    def __init__(self, component: str, cause: BaseException, *, folder: str | None = None) -> None:
        text = " ".join(str(cause).split()) or "(no message)"
        where = f" {folder}" if folder else ""
        super().__init__(
            f"component {component!r}: {type(cause).__name__} while loading{where}: {text}"
        )
        self.component = component
        self.cause = cause
        self.folder = folder
