"""Expected failures, declared by the adopter of a loader: `--expectations=FILE`.

The file is plain text, one entry a line; blank lines and lines starting with `#` are ignored:

    RULE-ID: reason
    RULE-ID @DEVICE: reason

`@DEVICE` limits the entry to one runtime device: `@cuda` matches `cuda` and `cuda:N`, `@cuda:1`
only `cuda:1`. The reason is required. An ID missing from the catalogue, a malformed line, a device
torch does not know, and two entries that could apply to one device are errors naming the line.

How expectations act (strict, at the level of rules, since a rule is what the report judges):
  * a failing test is an expected failure (`xfailed`) when every rule it names is expected;
  * an expected rule none of whose tests failed, while at least one passed, is an unexpected pass:
    the rule is reported `failed` and the run fails, so a fixed bug shows up;
  * an expected rule whose tests were all skipped stays `skipped`: nothing was learned about it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from reference.kit.errors import KitError
from reference.rules import BY_ID

__all__ = [
    "Expectation",
    "Expectations",
    "ExpectationsError",
    "expected_reason",
    "parse_expectations",
    "read_expectations",
]

_LINE = re.compile(
    r"^(?P<rule>[^\s:@]+)(?:\s+@(?P<device>[A-Za-z_]+(?::\d+)?))?\s*:\s*(?P<reason>.*?)\s*$"
)


class ExpectationsError(KitError, ValueError):
    """An expectations file is malformed or names a rule the catalogue lacks."""


@dataclass(frozen=True)
class Expectation:
    """One declared expected failure.

    Attributes:
        rule: a catalogue rule ID.
        device: the runtime device it is limited to, or None for every device.
        reason: why the loader is expected to fail the rule (shown in the report).
        line: its line number in the file.
    """

    rule: str
    device: str | None
    reason: str
    line: int

    def applies_to(self, device: str) -> bool:
        """Whether this entry covers the runtime device `device` (e.g. `cpu`, `cuda:0`)."""
        if self.device is None:
            return True
        mine, theirs = torch.device(self.device), torch.device(device)
        return mine == theirs or (mine.index is None and mine.type == theirs.type)


@dataclass(frozen=True)
class Expectations:
    """The entries of one expectations file."""

    source: str
    entries: tuple[Expectation, ...]

    def for_device(self, device: str) -> dict[str, str]:
        """Expected-failing rule IDs on `device`, each with its reason."""
        return {e.rule: e.reason for e in self.entries if e.applies_to(device)}


def read_expectations(path: str | Path) -> Expectations:
    """Read and validate an expectations file.

    Raises:
        ExpectationsError: the file cannot be read, or `parse_expectations` refuses it.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ExpectationsError(f"cannot read expectations file {path}: {error}") from None
    return parse_expectations(text, source=str(path))


def parse_expectations(text: str, *, source: str) -> Expectations:
    """Parse the text of an expectations file (format in the module docstring).

    Args:
        text: the file's content.
        source: the file name, used in messages.

    Raises:
        ExpectationsError: `source:line: problem` for the first bad line.
    """
    entries: list[Expectation] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        match = _LINE.match(line)
        if match is None:
            raise ExpectationsError(
                f"{where}: cannot read {line!r}; write 'RULE-ID: reason' or "
                "'RULE-ID @device: reason'"
            )
        rule, device, reason = match["rule"], match["device"], match["reason"]
        if rule not in BY_ID:
            raise ExpectationsError(
                f"{where}: {rule!r} is not a rule of the catalogue "
                "(python -m reference rules lists them)"
            )
        if device is not None:
            try:
                torch.device(device)
            except RuntimeError:
                raise ExpectationsError(f"{where}: unknown device {device!r}") from None
        if not reason:
            raise ExpectationsError(f"{where}: {rule} needs a reason after the colon")
        entry = Expectation(rule, device, reason, number)
        for other in entries:
            if other.rule == rule and _overlap(other.device, device):
                raise ExpectationsError(
                    f"{where}: {rule} is already expected on that device at line {other.line}"
                )
        entries.append(entry)
    return Expectations(source, tuple(entries))


def expected_reason(test_rules: Iterable[str], expected: Mapping[str, str]) -> str | None:
    """Why a failure of a test naming `test_rules` is expected, or None when it is not.

    A failure is expected only when every rule the test names is expected: a test that also pins
    a rule nobody declared must not hide that rule's failure.
    """
    rules = list(dict.fromkeys(test_rules))
    if not rules or any(rule not in expected for rule in rules):
        return None
    return "; ".join(f"{rule}: {expected[rule]}" for rule in rules)


def _overlap(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return True
    da, db = torch.device(a), torch.device(b)
    return da.type == db.type and (da.index is None or db.index is None or da.index == db.index)
