"""Every file the loader reads goes through here: checked, bounded, never blocking.

Hostile input reaches a loader as files: a shard index that is a named pipe would block a reader
forever, one linked to `/dev/zero` grows memory without bound, and legal JSON well under a size
cap can expand fifty-fold when parsed. So a file is read only when it is a regular file (after
following links), no larger than the cap for its kind, through a descriptor opened
non-blocking, and JSON is parsed only after a scan of its raw bytes keeps it within a budget:

  * kinds and caps: a safetensors header `MAX_HEADER_BYTES` (safetensors' own bound), a shard
    index `MAX_INDEX_BYTES`, `model_index.json` and `config.json` `MAX_CONFIG_BYTES`;
  * JSON: nesting at most `MAX_JSON_DEPTH` deep, at most `MAX_JSON_VALUES` values, numbers of
    at most `MAX_NUMBER_DIGITS` digits (Python's own integer limit, 4300 digits, would fail later
    and name no key).

Every refusal is a `CheckpointError` naming the path as the user gave it (which shows bytes that
are not UTF-8 and control characters escaped, so a message is one printable line).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from reference.errors import CheckpointError

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_INDEX_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_NUMBER_DIGITS",
    "check_json_budget",
    "checkpoint_error",
    "load_json",
    "no_cyclic_gc",
    "open_regular",
    "read_bounded",
    "regular_file_size",
]

MAX_INDEX_BYTES = 64 * 1024 * 1024
MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_JSON_DEPTH = 32
MAX_JSON_VALUES = 16_000_000
MAX_NUMBER_DIGITS = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:', re.DOTALL)
_LONG_NUMBER = re.compile(rb"[0-9]{%d,}" % (MAX_NUMBER_DIGITS + 1))
_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def checkpoint_error(path: Path, entry: str | None, problem: str) -> CheckpointError:
    """The error for `path` (and `entry`, a tensor name or header field, or None); the error
    shows both as one printable line itself."""
    return CheckpointError(os.fsdecode(path), entry, problem)


def regular_file_size(path: Path, *, what: str) -> int:
    """The size of `path`, a regular file (links followed); nothing is opened.

    Raises:
        CheckpointError: missing, unreadable, or not a regular file (a folder, pipe, socket or
            device would block or never end), naming the path.
    """
    try:
        status = os.stat(os.fsencode(path))
    except FileNotFoundError:
        raise checkpoint_error(path, None, f"{what} not found") from None
    except OSError as exc:  # a link loop, a path too long, no permission
        raise checkpoint_error(
            path, None, f"{what} cannot be read ({exc.strerror or exc})"
        ) from None
    if not stat.S_ISREG(status.st_mode):
        raise checkpoint_error(
            path,
            None,
            f"is not a regular file (a folder, pipe, socket or device); give the {what} itself",
        )
    return status.st_size


def open_regular(path: Path, *, what: str) -> tuple[int, os.stat_result]:
    """A descriptor of `path`, a regular file, and its status: opened non-blocking and checked
    again with `fstat`, so a file replaced by a pipe after `regular_file_size` looked at it
    cannot block the caller. The caller closes the descriptor.

    Raises:
        CheckpointError: naming the path: it cannot be opened, or is not a regular file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.fsencode(path), flags)
    except FileNotFoundError:
        raise checkpoint_error(path, None, f"{what} not found") from None
    except OSError as exc:
        raise checkpoint_error(
            path, None, f"{what} cannot be opened ({exc.strerror or exc})"
        ) from None
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise checkpoint_error(
            path, None, f"{what} was replaced by something that is not a regular file"
        )
    return fd, status


def read_bounded(path: Path, *, what: str, limit: int) -> bytes:
    """The whole of `path`, a regular file of at most `limit` bytes.

    The descriptor is opened non-blocking and checked again, so a file replaced by a pipe
    between the check and the open cannot block the read, and at most `limit + 1` bytes are
    ever read, so a file that grew past the cap cannot grow memory.

    Raises:
        CheckpointError: naming the path: missing, not a regular file, or larger than `limit`.
    """
    size = regular_file_size(path, what=what)
    if size > limit:
        raise checkpoint_error(
            path, None, f"{what} is {size} bytes; at most {limit} are read for a {what}"
        )
    fd, _ = open_regular(path, what=what)
    try:
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise checkpoint_error(
            path, None, f"{what} cannot be read ({exc.strerror or exc})"
        ) from None
    finally:
        os.close(fd)
    if total > limit:
        raise checkpoint_error(path, None, f"{what} grew past {limit} bytes while it was read")
    return b"".join(chunks)


def _key_before(raw: bytes, position: int) -> str | None:
    keys = list(_KEY.finditer(raw, 0, position))
    return keys[-1].group(1).decode("utf-8", "backslashreplace") if keys else None


def _too_deep_entry(raw: bytes) -> str | None:
    """The top-level key whose value first nests deeper than MAX_JSON_DEPTH (strings, with
    their escapes, skipped), or None when the nesting is not inside a key's value. Runs only
    once the text is known to nest too deep."""
    depth, in_string, escaped, start = 0, False, False, -1
    last_key: str | None = None
    for position, byte in enumerate(raw):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # the closing quote
                in_string = False
                if depth == 1 and raw[position + 1 : position + 65].lstrip()[:1] == b":":
                    last_key = raw[start + 1 : position].decode("utf-8", "backslashreplace")
        elif byte == 0x22:
            in_string, start = True, position
        elif byte in b"[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return last_key
        elif byte in b"]}":
            depth -= 1
    return None


def check_json_budget(path: Path, raw: bytes, *, what: str) -> None:
    """Refuse JSON text that would cost more to parse than any real checkpoint's does.

    Raises:
        CheckpointError: nesting deeper than MAX_JSON_DEPTH, more than MAX_JSON_VALUES values,
            or a number longer than MAX_NUMBER_DIGITS digits (naming the key it follows).
    """
    bare = _STRING.sub(b'""', raw)
    long_number = _LONG_NUMBER.search(bare)
    if long_number is not None:
        # Find the same number in the raw text to name the key in front of it.
        found = re.search(re.escape(long_number.group()), raw)
        key = _key_before(raw, found.start() if found else len(raw))
        raise checkpoint_error(
            path,
            key,
            f"{what} holds a number of {len(long_number.group())} digits or more; no field of"
            f" a checkpoint needs more than {MAX_NUMBER_DIGITS}",
        )
    values = bare.count(b",") + bare.count(b"[") + bare.count(b"{")
    if values > MAX_JSON_VALUES:
        raise checkpoint_error(
            path,
            None,
            f"{what} holds about {values} JSON values; at most {MAX_JSON_VALUES} are parsed",
        )
    brackets = bare.translate(None, _NOT_BRACKETS)
    for _ in range(MAX_JSON_DEPTH):
        if not brackets:
            return
        brackets = _PAIR.sub(b"", brackets)
    # Still deeper, unless what is left has no innermost pair: unbalanced text, which the
    # parser itself refuses as not JSON.
    if brackets and _PAIR.search(brackets):
        raise checkpoint_error(
            path, _too_deep_entry(raw), f"{what} nests deeper than {MAX_JSON_DEPTH} levels"
        )


class _DuplicateKeyError(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):  # rare: find the repeated key only then
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKeyError(key)
            seen.add(key)
    return result


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector paused while a parse builds millions of objects that form no cycle
    (a header of a million entries): otherwise each collection walks every object built so far,
    and the collections took most of the parse's time. Restored as it was on exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load_json(path: Path, raw: bytes, what: str) -> object:
    """Strict JSON: UTF-8 only, and a key twice in one object is an error, not "last one wins".

    Args:
        path: the file the bytes come from, named by the error.
        raw: the JSON text.
        what: what the text is ("header", "index"), for the message.

    Raises:
        CheckpointError: for bad UTF-8, bad JSON (also too deep, or a number too long) or a
            duplicate key, naming the key.
    """
    check_json_budget(path, raw, what=what)
    try:
        with no_cyclic_gc():
            return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except _DuplicateKeyError as dup:
        raise checkpoint_error(
            path, dup.key, f"{what} names {dup.key!r} twice; names must be unique"
        ) from None
    # ValueError covers bad UTF-8, bad JSON and integers too long to convert; RecursionError covers
    # nesting too deep for the parser.
    except (ValueError, RecursionError) as exc:
        raise checkpoint_error(path, None, f"{what} is not valid JSON ({exc})") from None
