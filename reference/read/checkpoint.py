"""Safetensors checkpoints: files, shard index, header preflight and a tensor-at-a-time reader.

Headers are parsed and validated (reference/read/header.py) without reading tensor data, so a
checkpoint can be checked against a model before the model is touched (CKPT-3) and corrupt input
becomes one clear `CheckpointError` naming the file and the entry (CKPT-4). Only safetensors is
read: pickle files are refused without being opened (CKPT-1).

Tensors on CPU are views into a private (copy-on-write) memory map of the file: reading one
allocates nothing, and writing to it never reaches the file (ZC-13). Tensors for another device
are copied there one at a time from that map.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from reference.errors import CheckpointError, shown
from reference.files import MAX_INDEX_BYTES, checkpoint_error, load_json, read_bounded
from reference.read.header import (
    DTYPES,
    MAX_HEADER_BYTES,
    PICKLE_SUFFIXES,
    FileIdentity,
    ShardHeader,
    TensorInfo,
    read_header,
    refuse_pickle,
)
from reference.read.prefetch import Prefetch, start_prefetch

__all__ = [
    "DTYPES",
    "INDEX_SUFFIX",
    "MAX_HEADER_BYTES",
    "PICKLE_SUFFIXES",
    "Checkpoint",
    "CheckpointError",
    "ShardHeader",
    "StreamingReader",
    "TensorInfo",
    "TensorReader",
    "current_progress",
    "hidden_files",
    "is_model_folder",
    "open_checkpoint",
    "read_header",
    "reading_progress",
    "refuse_pickle",
    "skipped_notes",
    "truncation",
]

INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class Checkpoint:
    """A whole checkpoint (one file or several shards), known from its headers alone.

    Attributes:
        files: the safetensors files, in load order.
        tensors: every tensor by name; each name appears in exactly one file.
        metadata: the `__metadata__` of the first file (where configs sometimes hide).
        file_metadata: the `__metadata__` of every file, by file (a shard may declare what the
            first does not).
        identities: which file each path named when its header was validated; the reader maps
            a file only while the path still names that file.
        skipped: dotfiles of the folder named like shards or indexes, not read (`hidden_files`).
    """

    files: tuple[Path, ...]
    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str] = field(default_factory=dict)
    file_metadata: Mapping[Path, Mapping[str, str]] = field(default_factory=dict)
    identities: Mapping[Path, FileIdentity] = field(default_factory=dict)
    skipped: tuple[Path, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(info.nbytes for info in self.tensors.values())

    @property
    def largest_tensor_bytes(self) -> int:
        return max((info.nbytes for info in self.tensors.values()), default=0)


def _read_index(index_path: Path) -> dict[str, Path]:
    content = read_bounded(index_path, what="index file", limit=MAX_INDEX_BYTES)
    raw = load_json(index_path, content, "index")
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise checkpoint_error(
            index_path, "weight_map", "must be an object mapping tensor names to shard files"
        )
    base = index_path.parent
    shards: dict[str, Path] = {}
    for name, shard in weight_map.items():
        shard_path = base / shard
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise checkpoint_error(
                index_path, name, f"shard {shard!r} must be a file name next to the index"
            )
        shards[name] = shard_path
    return shards


def _merge(headers: list[ShardHeader]) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for header in headers:
        for info in header.tensors:
            if info.name in tensors:
                raise checkpoint_error(
                    info.file,
                    info.name,
                    f"tensor also present in {tensors[info.name].file.name}; each name must live in"
                    " exactly one shard",
                )
            tensors[info.name] = info
    return tensors


def _checkpoint(
    files: tuple[Path, ...], tensors: dict[str, TensorInfo], headers: list[ShardHeader]
) -> Checkpoint:
    return Checkpoint(
        files,
        tensors,
        headers[0].metadata if headers else {},
        {header.path: header.metadata for header in headers},
        {header.path: header.identity for header in headers if header.identity is not None},
    )


def _open_index(index_path: Path) -> Checkpoint:
    weight_map = _read_index(index_path)
    files = tuple(dict.fromkeys(weight_map.values()))
    for shard in files:
        if not shard.exists():
            names = sorted(n for n, f in weight_map.items() if f == shard)
            raise checkpoint_error(
                index_path, names[0], f"names shard {shard.name}, which does not exist"
            )
    headers = [read_header(shard) for shard in files]
    tensors = _merge(headers)
    for name, shard in weight_map.items():
        if name not in tensors:
            raise checkpoint_error(
                index_path, name, f"index places it in {shard.name}, whose header lacks it"
            )
        if tensors[name].file != shard:
            raise checkpoint_error(
                index_path,
                name,
                f"index places it in {shard.name}, but it is in {tensors[name].file.name}",
            )
    unlisted = sorted(set(tensors) - set(weight_map))
    if unlisted:
        raise checkpoint_error(
            tensors[unlisted[0]].file, unlisted[0], "tensor is in a shard but not in the index"
        )
    return _checkpoint(files, tensors, headers)


def _hidden(path: Path) -> bool:
    """Dotfiles in a checkpoint folder are not shards: macOS writes `._model.safetensors`
    (AppleDouble metadata) beside every file copied to a foreign filesystem."""
    return path.name.startswith(".")


def hidden_files(folder: Path) -> tuple[Path, ...]:
    """The dotfiles of `folder` named like a shard or an index: never read as part of the
    checkpoint, and reported (`skipped_notes`) so that a user sees what was left out."""
    if not folder.is_dir():
        return ()
    return tuple(
        sorted(
            p
            for p in folder.iterdir()
            if _hidden(p) and p.name.endswith((".safetensors", INDEX_SUFFIX))
        )
    )


def is_model_folder(folder: Path) -> bool:
    """Whether `folder` holds a model: a `config.json` or weight files (safetensors shards, an
    index, or pickled checkpoints), dotfiles aside. This is what tells a weight-bearing
    component from a scheduler, a tokenizer or a processor (which save their own
    `*_config.json` and vocabulary files), whatever the component is named."""
    if not folder.is_dir():
        return False
    weights = (".safetensors", INDEX_SUFFIX, *PICKLE_SUFFIXES)
    return any(
        not _hidden(p) and (p.name == "config.json" or p.name.endswith(weights))
        for p in folder.iterdir()
    )


def skipped_notes(files: Iterable[Path]) -> tuple[str, ...]:
    """One note per skipped dotfile, for a load report."""
    return tuple(
        f"skipped {shown(path)}: a dotfile (such as macOS's ._ metadata), not part of the"
        " checkpoint"
        for path in files
    )


def open_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Resolve a checkpoint and validate all its headers (CKPT-1..4); reads no tensor data.

    Args:
        path: a `.safetensors` file, a `*.safetensors.index.json`, or a folder holding either
            (an index wins; otherwise every `*.safetensors` in the folder is a shard; dotfiles,
            such as macOS's `._*` AppleDouble files, are not).

    Raises:
        CheckpointError: naming the file (and entry) at fault.
    """
    path = Path(path)
    if path.is_dir():
        indexes = sorted(p for p in path.glob(f"*{INDEX_SUFFIX}") if not _hidden(p))
        if len(indexes) > 1:
            raise checkpoint_error(
                path, None, f"holds {len(indexes)} shard indexes; keep exactly one"
            )
        if indexes:
            return replace(_open_index(indexes[0]), skipped=hidden_files(path))
        files = sorted(p for p in path.glob("*.safetensors") if not _hidden(p))
        if not files:
            pickles = sorted(p for p in path.iterdir() if p.name.endswith(PICKLE_SUFFIXES))
            if pickles:
                refuse_pickle(pickles[0])
            raise checkpoint_error(path, None, "holds no *.safetensors file")
        headers = [read_header(f) for f in files]
        return replace(
            _checkpoint(tuple(files), _merge(headers), headers), skipped=hidden_files(path)
        )
    if path.name.endswith(INDEX_SUFFIX):
        return _open_index(path)
    header = read_header(path)
    return _checkpoint((path,), _merge([header]), [header])


_PROGRESS: ContextVar[Callable[[int], object] | None] = ContextVar("progress", default=None)


@contextmanager
def reading_progress(callback: Callable[[int], object]) -> Iterator[None]:
    """Within this context, every `TensorReader.read` calls `callback(nbytes)` once it has read
    a tensor (progress bars on long loads); nothing else changes."""
    token = _PROGRESS.set(callback)
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def current_progress() -> Callable[[int], object] | None:
    """The `reading_progress` callback in force in this context, if any (a load that runs its
    readers in threads of its own passes it on to them)."""
    return _PROGRESS.get()


def truncation(info: TensorInfo, size: int) -> str | None:
    """The problem with a file of `size` bytes that should hold `info`'s bytes, or None."""
    if size >= info.end:
        return None
    return (
        f"file is {size} bytes but the tensor ends at byte {info.end}; it was truncated since"
        " its header was read. Re-open the checkpoint"
    )


class TensorReader:
    """Reads a checkpoint's tensors one at a time, from a private memory map of each file.

    A CPU tensor returned by `read` is a view into the map (no allocation, copy-on-write); for any
    other device the bytes are copied there from the map. The reader never builds a state dict.
    It maps as safetensors' `safe_open` does (`UntypedStorage.from_file(shared=False)`), but keeps
    the map itself: one storage per file that every tensor of the file views, dropped after each
    read by `StreamingReader`, and a size check before each read that names the file and the
    tensor. Where the headers are concerned, `tests/unit/test_safe_open_agreement.py` pins what
    the project checks beyond `safe_open`.

    A file that shrank after its header was read is caught at each `read` (the file's size is
    checked before its bytes are touched). What cannot be defended: a file truncated while the
    pages of a tensor are still to be touched, that is while a returned CPU view is alive, or
    between the size check and the copy of a device read; touching lost pages of a memory map is
    a SIGBUS. Checkpoint files must not be rewritten in place while a load is running.

    With `prefetch` threads, each file's map is populated in the background as soon as it is
    mapped (`reference.read.prefetch`: the zero-copy path's first forward then finds its pages
    resident); `prefetches` holds one `Prefetch` per file so started. Reads never wait for it.

    Attributes:
        fresh_names: the names whose CPU tensors `read` returns in a fresh allocation of their
            own (never a view of a file map), which a caller may keep as the loaded tensor
            instead of copying it; none for this reader (`reference.read.pool.PooledReader` has
            some).
    """

    fresh_names: frozenset[str] = frozenset()

    def __init__(self, checkpoint: Checkpoint, *, prefetch: int = 0) -> None:
        self.checkpoint = checkpoint
        self._maps: dict[Path, tuple[int, torch.Tensor]] = {}
        self._prefetch = prefetch
        self.prefetches: list[Prefetch] = []

    def _open(self, info: TensorInfo) -> int:
        """A descriptor of the file `info` lives in, refused unless it is the file whose header
        was validated (a regular file, same device, inode, size and modification time).

        Opened non-blocking, as the header pass opens it: a file swapped for a named pipe,
        socket or device after its header was checked must be refused, not waited on."""
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(os.fsencode(info.file), flags)
        except OSError as exc:
            raise checkpoint_error(
                info.file,
                info.name,
                f"file can no longer be read ({exc.strerror or exc}); it changed since its header"
                " was read. Re-open the checkpoint",
            ) from None
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            os.close(fd)
            raise checkpoint_error(
                info.file,
                info.name,
                "file was replaced by something that is not a regular file (a pipe, socket or"
                " device) since its header was read. Re-open the checkpoint",
            )
        expected = self.checkpoint.identities.get(info.file)
        problem = truncation(info, status.st_size)
        if problem is None and expected is not None and FileIdentity.of(status) != expected:
            problem = (
                "file changed since its header was read (replaced, rewritten or resized: its"
                " inode, size or modification time differ); the tensors would not be the ones"
                " validated. Re-open the checkpoint"
            )
        if problem is not None:
            os.close(fd)
            raise checkpoint_error(info.file, info.name, problem)
        return fd

    def _map(self, info: TensorInfo) -> torch.Tensor:
        held = self._maps.get(info.file)
        if held is not None:
            fd, mapped = held
            # The map is of the validated file itself; only its own size can change under it.
            problem = truncation(info, os.fstat(fd).st_size)
            if problem is not None:
                raise checkpoint_error(info.file, info.name, problem)
            return mapped
        fd = self._open(info)
        # Mapped through the descriptor just checked, so the file mapped is the file validated
        # (and a path that is not UTF-8 needs no decoding).
        name = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else os.fspath(info.file)
        try:
            # shared=False maps privately: writes to a view never reach the file.
            size = os.fstat(fd).st_size
            storage = torch.UntypedStorage.from_file(name, shared=False, nbytes=size)
        except (RuntimeError, OSError, UnicodeError) as exc:
            os.close(fd)
            raise checkpoint_error(info.file, info.name, f"file cannot be mapped ({exc})") from None
        mapped = torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[arg-type]
        self._maps[info.file] = (fd, mapped)
        if self._prefetch:
            started = start_prefetch(mapped, workers=self._prefetch)
            if started is not None:
                self.prefetches.append(started)
        return mapped

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        """One tensor, on `device`, with the dtype and shape of its header.

        Raises:
            KeyError: for a name the checkpoint does not hold.
            CheckpointError: when the file no longer holds the tensor's bytes (it was truncated,
                removed or replaced since its header was read), naming the file and the tensor.
        """
        info = self.checkpoint.tensors[name]
        mapped = self._map(info)
        itemsize = info.dtype.itemsize
        if info.start % itemsize:
            # Misaligned in the file: a view of that dtype is impossible.
            tensor = mapped[info.start : info.end].clone().view(info.dtype).view(info.shape)
        else:
            # One tensor over the map's storage at the tensor's offset: the same bytes as a
            # slice viewed as the dtype, then as the shape, in one call instead of three (about
            # 2.5 us less a tensor: half a millisecond of a 231-tensor load).
            # (torch's stubs want the strides too; without them, set_ makes it contiguous.)
            tensor = torch.empty(0, dtype=info.dtype).set_(  # type: ignore[call-overload]
                mapped.untyped_storage(), info.start // itemsize, info.shape
            )
        if device.type != "cpu":
            tensor = tensor.to(device)
        self._progress(info.nbytes)
        return tensor

    @staticmethod
    def _progress(nbytes: int) -> None:
        """Tell the `reading_progress` callback, if any, that a tensor of `nbytes` was read."""
        progress = _PROGRESS.get()
        if progress is not None:
            progress(nbytes)

    def __iter__(self) -> Iterator[str]:
        """Tensor names in file order (each file read front to back)."""
        by_file = sorted(
            self.checkpoint.tensors.values(),
            key=lambda i: (self.checkpoint.files.index(i.file), i.start),
        )
        return iter([info.name for info in by_file])

    def close(self) -> None:
        """Drop the maps and their descriptors; tensors already handed out keep their own
        reference to the map."""
        maps, self._maps = self._maps, {}
        for fd, _ in maps.values():
            os.close(fd)

    def __del__(self) -> None:
        # A reader dropped without close() gives its descriptors back all the same.
        if getattr(self, "_maps", None):
            self.close()


class StreamingReader(TensorReader):
    """A `TensorReader` that keeps no map between reads: for loads that copy every tensor.

    Each `read` maps the file afresh and the map lives only as long as the returned tensor, so
    once a caller has copied a tensor and dropped it, its pages leave the process: resident
    memory grows by the copies alone, never by the files (VAE-1). Adoption (zero-copy) needs
    the maps kept, and uses `TensorReader`. It never prefetches: each map lives for one tensor.
    """

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint)

    def read(self, name: str, *, device: torch.device) -> torch.Tensor:
        try:
            return super().read(name, device=device)
        finally:
            self.close()
