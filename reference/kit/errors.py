"""The kit's own errors: one base, so a caller can tell the suite's failures from the loader's.

A loader's refusals are `reference.errors.LoadError`s (or the adopter's own types); these are
what the kit itself raises when it cannot judge: a bad `--loader`, a malformed expectations file
or report, a test reaching past the seam, the contract tests missing from an install.
"""

from __future__ import annotations

__all__ = ["KitError"]


class KitError(Exception):
    """Base of every error the conformance kit raises on purpose."""
