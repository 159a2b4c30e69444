"""What to install for an optional feature, as a command that works today.

The project is not on the package index yet, so `pip install 'diffusion-loader-conformance[x]'`
fails there. The packages an extra stands for are read from the installed distribution's own
metadata (pyproject.toml is their one source), so a hint can name them directly; from a clone the
extra itself installs with `pip install -e '.[x]'`.
"""

from __future__ import annotations

import re
from importlib import metadata

__all__ = ["DISTRIBUTION", "extra_packages", "install_hint"]

DISTRIBUTION = "diffusion-loader-conformance"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def extra_packages(extra: str) -> tuple[str, ...]:
    """The requirements the extra `extra` adds, as the installed metadata lists them.

    Empty when the distribution is not installed (a bare source tree) or has no such extra.
    """
    try:
        requires = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return ()
    found = []
    for line in requires:
        requirement, _, marker = line.partition(";")
        match = _EXTRA_MARKER.search(marker)
        if match is not None and match.group(1) == extra:
            found.append(requirement.strip().replace(" ", ""))
    return tuple(found)


def install_hint(extra: str) -> str:
    """A command line that installs the extra `extra`, from wherever the user is.

    >>> install_hint("plot")  # doctest: +SKIP
    "pip install 'matplotlib' (the [plot] extra; in a clone: pip install -e '.[plot]')"
    """
    packages = " ".join(f"'{p}'" for p in extra_packages(extra))
    clone = f"pip install -e '.[{extra}]'"
    if not packages:
        return f"{clone} in a clone of the project"
    return f"pip install {packages} (the [{extra}] extra; in a clone: {clone})"
