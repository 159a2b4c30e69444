"""The reference's own readers: the bounded pool (reference.read.pool), prefetch
(reference.read.prefetch) and their options (reference.read.reading).

Timings are never asserted here; only values, where bytes live, what is in flight, which
threads are left and which errors are raised where.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from fakes.checkpoints import write_checkpoint, write_misaligned_checkpoint
from fakes.dit import PlainDiT, TinyDiT, write_dit_checkpoint
from fakes.layers import LINEAR_KINDS
from fakes.vae import StandardVAE
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.errors import ArgumentError, CheckpointError
from reference.kit.judging.file_maps import file_position, maps_missing
from reference.load.dit import DiTOptions, load_dit
from reference.load.vae import VAEOptions, load_vae
from reference.place.modules import find_slots
from reference.programs.bench.cache import drop
from reference.read import pool as pool_mod
from reference.read.checkpoint import TensorReader, open_checkpoint
from reference.read.header import TensorInfo
from reference.read.pool import READER_THREAD_NAME, PooledReader
from reference.read.prefetch import PREFETCH_THREAD_NAME, prefetch_supported, residency_supported
from reference.read.reading import ReadOptions, pool_options
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
OFFLOAD = WeightLoadPlan(checkpoint_load_device=CPU)
# The pool's own mechanics: every selected tensor through the pool, although a file just
# written is in the page cache.
SMALL = ReadOptions(workers=3, max_tensors=2, max_bytes=64, map_when_cached=False)


def reader_threads() -> set[threading.Thread]:
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith((READER_THREAD_NAME, PREFETCH_THREAD_NAME))
    }


@pytest.fixture
def no_thread_left() -> Iterator[None]:
    before = reader_threads()
    yield
    assert reader_threads() <= before, "a reader or prefetch thread outlived its reader"


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 16 bytes, so that small test tensors are split across the workers."""
    monkeypatch.setattr(pool_mod, "CHUNK_BYTES", 16)


def mixed_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        "a_large": torch.randn(64, 8),  # 2 KiB: larger than SMALL.max_bytes
        "b_empty": torch.zeros(0, 4),
        "c_half": torch.randn(7, 3).to(torch.float16),
        "d_int": torch.arange(5, dtype=torch.int64),
        "e_byte": torch.tensor([3], dtype=torch.uint8),
        "f_scalar": torch.tensor(2.5),
        "g_bool": torch.tensor([True, False, True]),
    }


def every_tensor(reader: TensorReader) -> dict[str, torch.Tensor]:
    return {name: reader.read(name, device=CPU) for name in reader}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


# --- ReadOptions -------------------------------------------------------------------------------


def test_read_options_are_keyword_only_frozen_and_defaulted() -> None:
    options = ReadOptions(prefetch=True)
    assert options.workers >= 1
    assert options.max_tensors >= 1
    assert options.max_bytes >= 1
    with pytest.raises(TypeError):
        ReadOptions(2, 4, 1024)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        options.workers = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"workers": -1}, "workers"),
        ({"workers": 2.0}, "workers"),
        ({"workers": True}, "workers"),
        ({"max_tensors": 0}, "max_tensors"),
        ({"max_tensors": "4"}, "max_tensors"),
        ({"max_bytes": 0}, "max_bytes"),
        ({"max_bytes": None}, "max_bytes"),
        ({"prefetch": 1}, "prefetch"),
        ({"prefetch": True, "workers": 0}, "prefetch"),
        ({"map_when_cached": 1}, "map_when_cached"),
        ({"map_when_cached": None}, "map_when_cached"),
    ],
)
def test_invalid_read_options_are_refused_naming_the_field(
    fields: dict[str, object], named: str
) -> None:
    with pytest.raises(ArgumentError, match=rf"ReadOptions\.{named}\b"):
        ReadOptions(**fields)  # type: ignore[arg-type]


def test_the_pool_is_the_dit_copy_paths_default_and_workers_0_turns_it_off() -> None:
    meta = torch.device("meta")
    assert pool_options(None, device=CPU, load="dit") == ReadOptions()
    assert pool_options(None, device=meta, load="dit") is None
    assert pool_options(None, device=CPU, load="vae") is None
    for load in ("dit", "vae"):
        assert pool_options(SMALL, device=CPU, load=load) is SMALL
        assert pool_options(ReadOptions(workers=0), device=CPU, load=load) is None
        assert pool_options(SMALL, device=meta, load=load) is SMALL


def test_a_pooled_reader_needs_a_worker(tmp_path: Path) -> None:
    path = write_checkpoint({"a": torch.ones(2)}, tmp_path)
    with pytest.raises(ArgumentError, match="workers"):
        PooledReader(open_checkpoint(path), ReadOptions(workers=0))


# --- the pool: values, freshness, the in-flight bound ---------------------------------------


@pytest.mark.parametrize("kept", [False, True], ids=["window", "shares"])
@pytest.mark.parametrize("shards", [1, 3])
def test_pooled_values_equal_the_file_each_in_a_fresh_buffer(
    tmp_path: Path, small_chunks: None, no_thread_left: None, shards: int, kept: bool
) -> None:
    state = mixed_state()
    path = write_checkpoint(state, tmp_path, shards=shards)
    reader = PooledReader(open_checkpoint(path), SMALL, buffers_kept=kept)
    try:
        read = every_tensor(reader)
    finally:
        reader.close()
    assert reader.fresh_names == frozenset(state)
    for name, tensor in state.items():
        assert same(read[name], tensor), name
        # its own storage, not a view of a file map or of a shared buffer
        assert read[name].untyped_storage().nbytes() == tensor.nbytes, name
        if tensor.nbytes and maps_missing() is None:
            assert file_position(read[name]) is None, name


def test_a_misaligned_tensor_is_read_whole(tmp_path: Path, no_thread_left: None) -> None:
    path = write_misaligned_checkpoint(tmp_path / "m.safetensors")
    reader = PooledReader(open_checkpoint(path), SMALL)
    try:
        read = every_tensor(reader)
    finally:
        reader.close()
    assert same(read["f16"], torch.tensor([1.5, -2.0], dtype=torch.float16))
    assert same(read["f32"], torch.tensor([3.0]))
    assert same(read["u8"], torch.tensor([7], dtype=torch.uint8))


class CountingReader(PooledReader):
    """Records the window (tensors, bytes in flight) each time a tensor enters it."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.windows: list[tuple[int, int]] = []

    def _schedule(self, info: TensorInfo) -> None:
        super()._schedule(info)
        self.windows.append((len(self._in_flight), self._in_flight_bytes))


@pytest.mark.parametrize(("max_tensors", "max_bytes"), [(2, 10_000), (8, 300), (3, 1)])
def test_at_most_k_tensors_and_b_bytes_are_in_flight(
    tmp_path: Path, small_chunks: None, max_tensors: int, max_bytes: int
) -> None:
    state = {f"t{n:02d}": torch.full((n % 5 + 1, 16), float(n)) for n in range(24)}
    state["big"] = torch.ones(1024)  # 4 KiB, larger than every max_bytes here but one
    path = write_checkpoint(state, tmp_path)
    options = ReadOptions(
        workers=2, max_tensors=max_tensors, max_bytes=max_bytes, map_when_cached=False
    )
    reader = CountingReader(open_checkpoint(path), options)
    try:
        read = every_tensor(reader)
    finally:
        reader.close()
    assert all(same(read[name], tensor) for name, tensor in state.items())
    assert len(reader.windows) == len(state)  # every tensor went through the window once
    for tensors, nbytes in reader.windows:
        assert tensors <= max_tensors
        assert tensors == 1 or nbytes <= max_bytes  # a tensor larger than B goes alone
    if max_bytes >= 10_000:
        assert max(t for t, _ in reader.windows) == max_tensors  # the window was used


def test_with_buffers_kept_each_worker_reads_one_contiguous_share_in_file_order(
    tmp_path: Path, small_chunks: None, no_thread_left: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tensor is scheduled by the first read, beyond the window's K and B, and the file's
    bytes are read as at most `workers` runs, each by one thread in increasing order."""
    state = {f"t{n:02d}": torch.full((n % 5 + 1, 16), float(n)) for n in range(24)}
    path = write_checkpoint(state, tmp_path)
    checkpoint = open_checkpoint(path)
    reads: list[tuple[str, int, int]] = []  # (thread, first byte in the file, length)
    lock = threading.Lock()
    real = pool_mod.read_range

    def recorded(fd: int, buffer: torch.Tensor, start: int, length: int, info: TensorInfo) -> None:
        with lock:
            reads.append((threading.current_thread().name, info.start + start, length))
        real(fd, buffer, start, length, info)

    monkeypatch.setattr(pool_mod, "read_range", recorded)
    options = ReadOptions(workers=3, max_tensors=2, max_bytes=64, map_when_cached=False)
    reader = PooledReader(checkpoint, options, buffers_kept=True)
    try:
        names = list(reader)
        first = reader.read(names[0], device=CPU)
        assert len(reader._in_flight) == len(state) - 1  # the rest, all in flight at once
        read = {names[0]: first} | {name: reader.read(name, device=CPU) for name in names[1:]}
    finally:
        reader.close()
    assert all(same(read[name], tensor) for name, tensor in state.items())
    assert all(thread.startswith(READER_THREAD_NAME) for thread, _, _ in reads)
    runs: dict[str, list[tuple[int, int]]] = {}
    for thread, start, length in reads:
        runs.setdefault(thread, []).append((start, length))
    spans: list[list[int]] = []  # [start, end) of each run of consecutive chunks on a thread
    for pieces in runs.values():  # a thread that finished its share may read another one
        own: list[list[int]] = []
        for start, length in pieces:
            if own and own[-1][1] == start:
                own[-1][1] = start + length
            else:
                own.append([start, start + length])
        spans += own
    assert len(spans) <= options.workers
    spans.sort()
    first_byte = min(info.start for info in checkpoint.tensors.values())
    last_byte = max(info.end for info in checkpoint.tensors.values())
    assert spans[0][0] == first_byte
    assert spans[-1][1] == last_byte
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # the runs tile the bytes


def test_closing_a_reader_mid_shares_stops_and_joins_its_threads(
    tmp_path: Path, small_chunks: None, no_thread_left: None
) -> None:
    state = {f"t{n:02d}": torch.full((64,), float(n)) for n in range(32)}
    path = write_checkpoint(state, tmp_path)
    reader = PooledReader(open_checkpoint(path), SMALL, buffers_kept=True)
    first = next(iter(reader))
    assert same(reader.read(first, device=CPU), state[first])
    reader.close()  # the other shares may be mid-read: they stop at their next chunk
    assert not reader._in_flight


@pytest.mark.parametrize("kept", [False, True], ids=["window", "shares"])
def test_names_read_out_of_order_or_twice_are_still_right(
    tmp_path: Path, small_chunks: None, no_thread_left: None, kept: bool
) -> None:
    state = mixed_state()
    path = write_checkpoint(state, tmp_path)
    reader = PooledReader(open_checkpoint(path), SMALL, buffers_kept=kept)
    try:
        names = list(reader)
        for name in [*reversed(names), *names]:
            assert same(reader.read(name, device=CPU), state[name]), name
        with pytest.raises(KeyError):
            reader.read("missing", device=CPU)
    finally:
        reader.close()


def test_tensors_not_pooled_are_views_of_the_map(tmp_path: Path) -> None:
    if maps_missing() is not None:
        pytest.skip(maps_missing())
    state = {"kept": torch.randn(64), "mapped": torch.randn(64)}
    path = write_checkpoint(state, tmp_path)
    reader = PooledReader(open_checkpoint(path), SMALL, pooled={"kept"})
    try:
        read = every_tensor(reader)
        assert reader.fresh_names == {"kept"}
        assert file_position(read["kept"]) is None
        assert file_position(read["mapped"]) is not None
        assert all(same(read[n], state[n]) for n in state)
    finally:
        reader.close()


# --- warm tensors from the map, cold ones through the pool ------------------------------------

MIB = 1 << 20


def three_mib_tensors(tmp_path: Path) -> tuple[dict[str, torch.Tensor], Path]:
    torch.manual_seed(4)
    state = {f"w{n}": torch.randn(3 * MIB // 4) for n in range(3)}  # 3 MiB each
    return state, write_checkpoint(state, tmp_path)


def cold_or_skip(path: Path) -> None:
    """Drop the file's pages, or skip where this file system keeps them (tmpfs)."""
    from reference.programs.bench.cache import cached_fraction, cannot_drop

    reason = cannot_drop()
    if reason is not None:
        pytest.skip(reason)
    drop([path])
    if cached_fraction([path]) > 0:
        pytest.skip(f"the page cache keeps {path}'s pages after POSIX_FADV_DONTNEED (tmpfs?)")


def read_and_close(reader: PooledReader) -> dict[str, torch.Tensor]:
    try:
        return every_tensor(reader)
    finally:
        reader.close()


@pytest.fixture
def residency() -> None:
    """Skip where the pool cannot tell cached pages (`mincore`) or a map's views (/proc)."""
    if not residency_supported():
        pytest.skip("telling what is cached needs Linux's mincore")
    if maps_missing() is not None:
        pytest.skip(maps_missing())


def test_map_when_cached_copies_a_cached_file_from_its_map(
    tmp_path: Path, no_thread_left: None, residency: None
) -> None:
    state, path = three_mib_tensors(tmp_path)
    path.read_bytes()  # every page cached
    reader = PooledReader(open_checkpoint(path), ReadOptions(workers=2, map_when_cached=True))
    read = read_and_close(reader)
    assert reader.fresh_names == frozenset()
    assert all(file_position(read[n]) is not None for n in state)  # views of the map
    assert all(same(read[n], state[n]) for n in state)


def test_cold_tensors_go_through_the_pool_and_cached_ones_come_from_the_map(
    tmp_path: Path, no_thread_left: None, residency: None
) -> None:
    state, path = three_mib_tensors(tmp_path)
    checkpoint = open_checkpoint(path)
    cold_or_skip(path)
    warm = checkpoint.tensors["w1"]
    with path.open("rb") as f:  # only w1's pages back in the cache: no read-ahead
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_RANDOM)
        f.seek(warm.start)
        f.read(warm.nbytes)
    reader = PooledReader(checkpoint, ReadOptions(workers=2, map_when_cached=True))
    read = read_and_close(reader)
    assert reader.fresh_names == {"w0", "w2"}
    assert file_position(read["w1"]) is not None
    assert file_position(read["w0"]) is None
    assert file_position(read["w2"]) is None
    assert all(same(read[n], state[n]) for n in state)


@pytest.mark.parametrize("kept", [False, True], ids=["window", "shares"])
@pytest.mark.parametrize("map_when_cached", [None, False], ids=["default", "off"])
def test_a_cached_file_is_copied_from_its_map_unless_told_otherwise(
    tmp_path: Path, no_thread_left: None, residency: None, kept: bool, map_when_cached: bool | None
) -> None:
    """By default (`map_when_cached`) a file wholly in the page cache is handed out as views of
    its map, which the load copies; with it off, the pool reads every tensor into a fresh
    buffer of its own."""
    state, path = three_mib_tensors(tmp_path)
    path.read_bytes()
    options = ReadOptions(workers=2)
    if map_when_cached is not None:
        options = ReadOptions(workers=2, map_when_cached=map_when_cached)
    reader = PooledReader(open_checkpoint(path), options, buffers_kept=kept)
    read = read_and_close(reader)
    pooled = map_when_cached is False
    assert reader.fresh_names == (frozenset(state) if pooled else frozenset())
    assert all(same(read[n], state[n]) for n in state)
    assert all((file_position(read[n]) is None) == pooled for n in state)


# --- errors reach the caller's thread; no thread is left --------------------------------------


class TruncatesAfterCheck(PooledReader):
    """Truncates the file right after its descriptor passed the identity and size checks, so
    the reader threads find the file shorter than the header says."""

    def _descriptor(self, info: TensorInfo) -> int:
        fd = super()._descriptor(info)
        if info.file.stat().st_size > info.start + 40:
            os.truncate(info.file, info.start + 40)
        return fd


@pytest.mark.parametrize("kept", [False, True], ids=["window", "shares"])
def test_a_file_truncated_after_its_check_fails_on_the_callers_thread(
    tmp_path: Path, small_chunks: None, kept: bool
) -> None:
    state = {"a": torch.randn(64), "b": torch.randn(64)}
    path = write_checkpoint(state, tmp_path)
    before = threading.enumerate()
    reader = TruncatesAfterCheck(open_checkpoint(path), SMALL, buffers_kept=kept)
    with pytest.raises(CheckpointError) as caught:
        every_tensor(reader)
    # In shares both tensors are read at once: the first to fail is named, either one.
    assert caught.value.file == str(path)
    assert caught.value.entry in ({"a", "b"} if kept else {"a"})
    assert "truncated" in caught.value.problem
    assert set(threading.enumerate()) <= set(before), "a reader thread was left behind"
    with pytest.raises(CheckpointError):  # a failed reader stays failed
        reader.read("b", device=CPU)
    reader.close()


def test_a_file_replaced_after_its_header_was_read_is_refused_before_reading(
    tmp_path: Path, no_thread_left: None
) -> None:
    path = write_checkpoint({"a": torch.randn(8)}, tmp_path)
    checkpoint = open_checkpoint(path)
    write_checkpoint({"a": torch.randn(9)}, tmp_path)
    reader = PooledReader(checkpoint, SMALL)
    with pytest.raises(CheckpointError) as caught:
        reader.read("a", device=CPU)
    assert (caught.value.file, caught.value.entry) == (str(path), "a")
    assert "changed since its header was read" in caught.value.problem


def test_a_load_through_the_pool_fails_cleanly_on_a_truncated_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_chunks: None
) -> None:
    """load_vae reading through the pool: a file cut after its check fails the load
    with the reader's error, on this thread, leaving no reader thread behind."""
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in StandardVAE().state_dict().items()}
    path = write_vae_checkpoint(state, tmp_path)
    monkeypatch.setattr("reference.load.vae.PooledReader", TruncatesAfterCheck)
    before = threading.enumerate()
    with pytest.raises(CheckpointError) as caught:
        load_vae(StandardVAE, path, device=CPU, options=VAEOptions(reading=SMALL))
    assert caught.value.file == str(path)
    assert caught.value.entry in state
    assert set(threading.enumerate()) <= set(before)


# --- the loads: the copy path and VAE streaming keep fresh buffers; adoption keeps views --------


def test_copy_path_keeps_pooled_buffers_and_adoption_keeps_map_views(
    tmp_path: Path, no_thread_left: None
) -> None:
    if maps_missing() is not None:
        pytest.skip(maps_missing())
    with torch.device("meta"):
        state_shapes = PlainDiT().state_dict()
    torch.manual_seed(0)
    state = {name: torch.randn(t.shape).to(t.dtype) for name, t in state_shapes.items()}
    path = write_checkpoint(state, tmp_path)

    copied, report = load_dit(
        PlainDiT,
        path,
        plan=OFFLOAD,
        kinds=LINEAR_KINDS,
        options=DiTOptions(adopt=False, reading=SMALL),
    )
    assert report.copied.bytes == sum(t.nbytes for t in state.values())
    for name, tensor in copied.state_dict().items():
        assert same(tensor, state[name]), name
        assert file_position(tensor) is None, f"{name} is a view of the file, not a copy"
    assert not isinstance(copied.time_scale, nn.Parameter)  # buffers stay buffers (ZC-15)

    adopted, report = load_dit(
        PlainDiT, path, plan=OFFLOAD, kinds=LINEAR_KINDS, options=DiTOptions(reading=SMALL)
    )
    params = dict(adopted.named_parameters())
    assert report.adopted.bytes == sum(p.nbytes for p in params.values())
    for name, param in params.items():
        assert same(param.detach(), state[name]), name
        assert file_position(param) is not None, f"{name} was not adopted from the file"


def test_copy_path_runs_weight_loaders_on_views_of_the_map(
    tmp_path: Path, no_thread_left: None
) -> None:
    """TinyDiT's linears carry weight_loaders: their tensors are read from the map (the loader
    copies them), the others through the pool; every value equals the checkpoint."""
    path, state = write_dit_checkpoint(tmp_path)
    module, report = load_dit(
        TinyDiT,
        path,
        plan=OFFLOAD,
        kinds=LINEAR_KINDS,
        options=DiTOptions(adopt=False, reading=SMALL),
    )
    assert report.adopted.tensors == 0
    loaded = module.state_dict()
    for name, tensor in state.items():
        assert same(loaded[name], tensor), name
        if maps_missing() is None:
            assert file_position(loaded[name]) is None, name


def test_vae_streaming_through_the_pool_fills_each_slot_with_its_own_tensor(
    tmp_path: Path, small_chunks: None, no_thread_left: None
) -> None:
    torch.manual_seed(1)
    state = {k: v.detach().clone() for k, v in StandardVAE().state_dict().items()}
    path = write_vae_checkpoint(state, tmp_path, shards=2)
    for reading in (None, SMALL, ReadOptions(workers=0)):
        module, report = load_vae(
            StandardVAE, path, device=CPU, options=VAEOptions(reading=reading)
        )
        loaded = module.state_dict()
        for name, tensor in state.items():
            assert same(loaded[name], tensor), name
            assert loaded[name].untyped_storage().nbytes() == tensor.nbytes, name
        assert {r.how for r in report.records} == {"streamed"}


# --- prefetch ----------------------------------------------------------------------------------


def resident_pages(address: int, length: int) -> tuple[int, int]:
    """(pages resident, pages) of the map range, by mincore."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = address - address % page
    count = -(-(address + length - start) // page)
    vector = (ctypes.c_ubyte * count)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(count * page), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(v & 1 for v in vector), count


def mapped_rss(address: int) -> int:
    """Resident bytes of the mapping holding `address`: its populated pages (smaps' Rss)."""
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(part, 16) for part in head.split("-"))
                inside = start <= address < end
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("no mapping holds the address")


@pytest.fixture
def linux_prefetch() -> None:
    if not sys.platform.startswith("linux") or not prefetch_supported():
        pytest.skip("prefetch needs Linux's madvise; elsewhere it is off, by design")


def test_prefetch_makes_the_map_resident_and_leaves_values_identical(
    tmp_path: Path, linux_prefetch: None
) -> None:
    torch.manual_seed(2)
    state = {f"w{n}": torch.randn(256, 256) for n in range(8)}  # 2 MiB
    path = write_checkpoint(state, tmp_path)
    checkpoint = open_checkpoint(path)
    drop([path])
    reader = TensorReader(checkpoint, prefetch=3)
    first = reader.read("w0", device=CPU)  # maps the file: the prefetch starts
    assert len(reader.prefetches) == 1
    prefetch = reader.prefetches[0]
    assert prefetch.wait(timeout=60)
    read = every_tensor(reader)
    reader.close()
    assert all(same(read[name], tensor) for name, tensor in state.items())
    base = first.untyped_storage().data_ptr()
    size = path.stat().st_size
    resident, pages = resident_pages(base, size)
    assert resident == pages, f"{pages - resident} of {pages} pages not resident"
    if prefetch.method == "populate":  # the page tables themselves were filled
        assert mapped_rss(base) >= size - os.sysconf("SC_PAGE_SIZE")
    assert not reader_threads()


def test_a_zero_copy_load_with_prefetch_adopts_map_views_and_returns(
    tmp_path: Path, linux_prefetch: None
) -> None:
    with torch.device("meta"):
        shapes = PlainDiT().state_dict()
    torch.manual_seed(3)
    state = {name: torch.randn(t.shape).to(t.dtype) for name, t in shapes.items()}
    path = write_checkpoint(state, tmp_path)
    drop([path])
    module, report = load_dit(
        PlainDiT,
        path,
        plan=OFFLOAD,
        kinds=LINEAR_KINDS,
        options=DiTOptions(reading=ReadOptions(prefetch=True)),
    )
    for thread in reader_threads():  # the load did not wait; the threads end on their own
        thread.join(timeout=60)
    assert not reader_threads()
    params = dict(module.named_parameters())
    assert report.adopted.bytes == sum(p.nbytes for p in params.values())
    for name, tensor in module.state_dict().items():
        assert same(tensor, state[name]), name
    if maps_missing() is None:
        assert all(file_position(p) is not None for p in params.values())


def test_prefetch_does_not_apply_to_a_load_through_the_pool(
    tmp_path: Path, no_thread_left: None
) -> None:
    with torch.device("meta"):
        shapes = PlainDiT().state_dict()
    state = {name: torch.ones(t.shape, dtype=t.dtype) for name, t in shapes.items()}
    path = write_checkpoint(state, tmp_path)
    reading = ReadOptions(workers=2, prefetch=True)
    module, _ = load_dit(
        PlainDiT,
        path,
        plan=OFFLOAD,
        kinds=LINEAR_KINDS,
        options=DiTOptions(adopt=False, reading=reading),
    )
    assert not reader_threads()  # nothing was left populating a map
    for name, tensor in module.state_dict().items():
        assert same(tensor, state[name]), name
        if maps_missing() is None:
            assert file_position(tensor) is None, name


def test_the_pool_keeps_the_buffers_a_standard_layers_loader_would_copy_unchanged(
    tmp_path: Path,
) -> None:
    """Column- and row-parallel layers at TP=1 (their loader copies the tensor unchanged): the
    pool reads them into the buffers that become the parameters, so nothing is copied twice."""
    from fakes.bench import BenchShapes, write_bench_checkpoints
    from reference.load.dit import build_dit, dit_reader

    shapes = BenchShapes.for_bytes(1 << 20)
    path, _ = write_bench_checkpoints(tmp_path, shapes)
    opened = open_checkpoint(path)
    module = build_dit(shapes.dit, component="transformer")
    options = ReadOptions(workers=2, map_when_cached=False)
    reader = dit_reader(
        opened,
        slots=find_slots(module),
        reading=options,
        copies_every_tensor=True,
        device=CPU,
        kinds=LINEAR_KINDS,
    )
    try:
        assert reader.fresh_names == frozenset(opened.tensors)
    finally:
        reader.close()
    loaded, report = load_dit(
        shapes.dit,
        path,
        plan=OFFLOAD,
        kinds=LINEAR_KINDS,
        options=DiTOptions(adopt=False, reading=options),
    )
    assert report.copied.bytes == opened.total_bytes
    plain = TensorReader(opened)
    try:
        for name, tensor in loaded.state_dict().items():
            assert torch.equal(tensor, plain.read(name, device=CPU)), name
            assert tensor.untyped_storage().nbytes() == tensor.nbytes, name  # its own buffer
    finally:
        plain.close()
