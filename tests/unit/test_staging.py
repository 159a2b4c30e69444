"""The staging reader and the copy-engine seam, proven on the CPU with a GPU-like fake engine.

`fakes.engine.DelayedEngine` completes copies late and out of order, reads each copy's source
when it finally runs, and can fail a copy or interrupt one: direct DiT loads and VAE streams
through it must equal an ordinary load bit for bit under many seeds and buffer sizes, and a
failure must leave nothing behind (no thread, no staging buffer, no descriptor). These tests call
the reference's own load functions with the engine in their steps: they judge the reference.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from fakes.checkpoints import write_checkpoint
from fakes.dit import DiTConfig, TinyDiT, write_dit_checkpoint
from fakes.engine import ENGINE_THREAD_NAME, CopyFailed, DelayedEngine
from fakes.layers import LINEAR_KINDS
from fakes.vae import StandardVAE
from fakes.vae_checkpoints import write_vae_checkpoint
from reference.errors import ArgumentError, CheckpointError, ComponentLoadError
from reference.load.dit import REFERENCE_DIT_STEPS, DiTOptions, load_dit
from reference.load.vae import REFERENCE_VAE_STEPS, VAEOptions, load_vae
from reference.read.checkpoint import open_checkpoint
from reference.read.engine import CompletedCopy, CpuEngine, CudaEngine, engine_for
from reference.read.header import TensorInfo
from reference.read.prefetch import residency_supported
from reference.read.reading import DIRECT_IO_ALIGNMENT, ReadOptions
from reference.read.staging import STAGING_THREAD_NAME, Segment, StagingReader, plan_fills
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
DIRECT = WeightLoadPlan(checkpoint_load_device=CPU, load_full_state_dict_on_device=True)
ORDINARY = WeightLoadPlan(checkpoint_load_device=CPU)
CONFIG = DiTConfig(hidden=64, heads=4, depth=2)
# (staging bytes, buffers): smaller than the largest tensor, one buffer only, a few, roomy.
RINGS = [(1000, 2), (4096, 1), (3000, 3), (1 << 20, 4)]
UNIT_SEEDS = [0, 1, 2]
LONG_SEEDS = range(50)


def staging_threads() -> set[threading.Thread]:
    names = (STAGING_THREAD_NAME, ENGINE_THREAD_NAME)
    return {t for t in threading.enumerate() if t.name.startswith(names)}


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def nothing_left() -> Iterator[None]:
    """No staging or engine thread outlives the test, and no descriptor stays open."""
    fds = open_fds()
    yield
    assert staging_threads() == set(), "a staging or engine thread outlived its load"
    assert open_fds() <= fds, "a file descriptor outlived its load"


def state_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.state_dict())


def assert_same_state(got: nn.Module, want: nn.Module) -> None:
    got_state, want_state = state_of(got), state_of(want)
    assert got_state.keys() == want_state.keys()
    for name, tensor in want_state.items():
        assert got_state[name].dtype == tensor.dtype, name
        assert torch.equal(got_state[name], tensor), f"{name} differs from an ordinary load"


def dit_options(engine: DelayedEngine | None, staging: int, buffers: int) -> DiTOptions:
    reading = ReadOptions(workers=3, staging_bytes=staging, staging_buffers=buffers)
    return DiTOptions(reading=reading, steps=replace(REFERENCE_DIT_STEPS, engine=engine))


def vae_options(engine: DelayedEngine | None, staging: int, buffers: int) -> VAEOptions:
    reading = ReadOptions(workers=3, staging_bytes=staging, staging_buffers=buffers)
    return VAEOptions(reading=reading, steps=replace(REFERENCE_VAE_STEPS, engine=engine))


@pytest.fixture(scope="module")
def dit_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _ = write_dit_checkpoint(tmp_path_factory.mktemp("dit"), config=CONFIG, shards=2)
    return path


@pytest.fixture(scope="module")
def vae_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(3)
    state = {k: v.detach().clone() for k, v in StandardVAE().state_dict().items()}
    return write_vae_checkpoint(state, tmp_path_factory.mktemp("vae"), shards=2)


def build() -> nn.Module:
    return TinyDiT(CONFIG)


# --- bit-exact against an ordinary load -------------------------------------------------------


def assert_ring_drained(engine: DelayedEngine, bound: int) -> None:
    """Closed after a load: the engine ran copies, got every staging buffer back, and never
    held more than `bound` bytes of them at once."""
    engine.close()
    assert engine.copies > 0
    assert engine.in_use == 0
    assert engine.peak <= bound


def direct_dit_equals_ordinary(
    path: Path, seed: int, dtype: torch.dtype | None, *, delay: float = 0.002
) -> None:
    want, _ = load_dit(build, path, plan=ORDINARY, kinds=LINEAR_KINDS, dtype=dtype)
    for staging, buffers in RINGS:
        engine = DelayedEngine(seed, max_delay=delay)
        got, report = load_dit(
            build,
            path,
            plan=DIRECT,
            kinds=LINEAR_KINDS,
            dtype=dtype,
            options=dit_options(engine, staging, buffers),
        )
        assert_ring_drained(engine, staging * buffers)
        assert report.plan.load_full_state_dict_on_device
        assert_same_state(got, want)


def vae_stream_equals_ordinary(
    path: Path, seed: int, dtype: torch.dtype | None, *, delay: float = 0.002
) -> None:
    want, _ = load_vae(StandardVAE, path, device=CPU, dtype=dtype)
    for staging, buffers in RINGS:
        engine = DelayedEngine(seed, max_delay=delay)
        got, _ = load_vae(
            StandardVAE,
            path,
            device=CPU,
            dtype=dtype,
            options=vae_options(engine, staging, buffers),
        )
        assert_ring_drained(engine, staging * buffers)
        assert_same_state(got, want)


@pytest.mark.parametrize("seed", UNIT_SEEDS)
def test_direct_dit_through_a_delayed_engine_equals_an_ordinary_load(
    dit_checkpoint: Path, nothing_left: None, seed: int
) -> None:
    direct_dit_equals_ordinary(dit_checkpoint, seed, dtype=torch.bfloat16 if seed else None)


@pytest.mark.parametrize("seed", UNIT_SEEDS)
def test_vae_stream_through_a_delayed_engine_equals_an_ordinary_load(
    vae_checkpoint: Path, nothing_left: None, seed: int
) -> None:
    vae_stream_equals_ordinary(vae_checkpoint, seed, dtype=torch.float16 if seed else None)


@pytest.mark.long
@pytest.mark.parametrize("seed", LONG_SEEDS)
def test_many_seeds_stay_bit_exact(
    dit_checkpoint: Path, vae_checkpoint: Path, nothing_left: None, seed: int
) -> None:
    # Shorter delays than the unit tier's: still out of order (each copy's delay is drawn
    # anew), at a quarter of the waiting.
    dtype = (None, torch.bfloat16, torch.float16)[seed % 3]
    direct_dit_equals_ordinary(dit_checkpoint, seed, dtype, delay=0.0005)
    vae_stream_equals_ordinary(vae_checkpoint, seed, dtype, delay=0.0005)


def test_the_default_direct_load_onto_the_cpu_reads_in_place(
    dit_checkpoint: Path, nothing_left: None
) -> None:
    """No engine given: the CPU's own, whose destinations are their own staging buffers."""
    want, _ = load_dit(build, dit_checkpoint, plan=ORDINARY, kinds=LINEAR_KINDS)
    got, _ = load_dit(build, dit_checkpoint, plan=DIRECT, kinds=LINEAR_KINDS)
    assert_same_state(got, want)
    staged, _ = load_dit(
        build,
        dit_checkpoint,
        plan=DIRECT,
        kinds=LINEAR_KINDS,
        options=DiTOptions(steps=replace(REFERENCE_DIT_STEPS, engine=CpuEngine(in_place=False))),
    )
    assert_same_state(staged, want)


@pytest.mark.parametrize(
    ("map_when_cached", "dtype"),
    [(True, None), (True, torch.float32), (False, None)],
    ids=["from-the-map-on-the-callers-thread", "from-the-map-on-threads", "from-the-file"],
)
def test_a_cached_file_read_in_place_equals_an_ordinary_load(
    tmp_path: Path, nothing_left: None, map_when_cached: bool, dtype: torch.dtype | None
) -> None:
    """Onto the CPU a cached file's tensors are copied out of its map: on the caller's thread
    where every tensor is kept as read, on the reader's threads where some are converted
    (transient); with `map_when_cached` off they are read from the file. The values are the
    same every way."""
    path, _ = write_dit_checkpoint(tmp_path, config=CONFIG, dtype=torch.bfloat16)
    path.read_bytes()  # every page cached
    want, _ = load_dit(build, path, plan=ORDINARY, kinds=LINEAR_KINDS, dtype=dtype)
    reading = ReadOptions(map_when_cached=map_when_cached)
    options = DiTOptions(reading=reading)
    got, _ = load_dit(build, path, plan=DIRECT, kinds=LINEAR_KINDS, dtype=dtype, options=options)
    assert_same_state(got, want)
    reader = StagingReader(open_checkpoint(path), engine=CpuEngine(), device=CPU, options=reading)
    read = {name: reader.read(name, device=CPU) for name in reader}
    if residency_supported():  # else nothing is known to be cached: threads read the file
        assert (reader._threads == []) == map_when_cached  # from the map: the caller's thread
    reader.close()
    assert len(read) == len(open_checkpoint(path).tensors)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_in_place_from_the_file_each_thread_reads_one_contiguous_share(
    tmp_path: Path, nothing_left: None, workers: int
) -> None:
    """Onto host memory from the disk, every tensor kept: no ring to bound, so the fills are
    one contiguous share of the bytes per thread (several sequential streams), and the tensors
    are the file's all the same."""
    path, _ = write_dit_checkpoint(tmp_path, config=CONFIG)
    checkpoint = open_checkpoint(path)
    reading = ReadOptions(workers=workers, staging_bytes=64, map_when_cached=False)
    reader = StagingReader(checkpoint, engine=CpuEngine(), device=CPU, options=reading)
    try:
        assert len(reader.fills) == workers
        assert [f.start for f in reader.fills] == sorted(f.start for f in reader.fills)
        read = {name: reader.read(name, device=CPU).clone() for name in reader}
    finally:
        reader.close()
    with safe_open(path, framework="pt") as f:
        assert all(torch.equal(read[name], f.get_tensor(name)) for name in f.keys())  # noqa: SIM118


def test_o_direct_reads_aligned_ranges(tmp_path: Path, nothing_left: None) -> None:
    path, _ = write_dit_checkpoint(tmp_path, config=CONFIG)
    want, _ = load_dit(build, path, plan=ORDINARY, kinds=LINEAR_KINDS)
    engine = DelayedEngine(7)
    reading = ReadOptions(staging_bytes=2 * DIRECT_IO_ALIGNMENT, staging_buffers=2, o_direct=True)
    options = DiTOptions(reading=reading, steps=replace(REFERENCE_DIT_STEPS, engine=engine))
    try:
        got, _ = load_dit(build, path, plan=DIRECT, kinds=LINEAR_KINDS, options=options)
    except CheckpointError as exc:  # a file system without O_DIRECT (tmpfs)
        engine.close()
        pytest.skip(f"this file system refuses O_DIRECT: {exc}")
    engine.close()
    assert_same_state(got, want)
    assert engine.in_use == 0
    assert engine.peak == reading.staging_bound


# --- failures leave nothing behind ------------------------------------------------------------


def load_direct_dit(path: Path, engine: DelayedEngine) -> object:
    return load_dit(
        build,
        path,
        plan=DIRECT,
        kinds=LINEAR_KINDS,
        component="transformer",
        options=dit_options(engine, 1000, 2),
    )


def stream_vae(path: Path, engine: DelayedEngine) -> object:
    return load_vae(
        StandardVAE, path, device=CPU, component="vae", options=vae_options(engine, 1000, 2)
    )


LOADS: dict[str, Callable[[Path, DelayedEngine], object]] = {
    "transformer": load_direct_dit,
    "vae": stream_vae,
}


@pytest.mark.parametrize("component", list(LOADS))
@pytest.mark.parametrize("fail_at", [0, 5, 40])
def test_a_failed_copy_fails_the_load_naming_the_component_and_tensor(
    dit_checkpoint: Path, vae_checkpoint: Path, nothing_left: None, component: str, fail_at: int
) -> None:
    path = dit_checkpoint if component == "transformer" else vae_checkpoint
    names = set(open_checkpoint(path).tensors)
    engine = DelayedEngine(fail_at, fail_at=fail_at)
    with pytest.raises(ComponentLoadError) as caught:
        LOADS[component](path, engine)
    engine.close()
    message = str(caught.value)
    assert f"component {component!r}" in message
    assert "copying tensor" in message
    assert any(repr(name) in message for name in names), message
    assert isinstance(caught.value.__cause__, CopyFailed)
    assert engine.in_use == 0, "a staging buffer was not released"


@pytest.mark.parametrize("component", list(LOADS))
@pytest.mark.parametrize("interrupt_at", [0, 7, 30])
def test_an_interrupt_mid_load_leaves_nothing_behind(
    dit_checkpoint: Path,
    vae_checkpoint: Path,
    nothing_left: None,
    component: str,
    interrupt_at: int,
) -> None:
    path = dit_checkpoint if component == "transformer" else vae_checkpoint
    engine = DelayedEngine(interrupt_at, interrupt_at=interrupt_at)
    with pytest.raises(KeyboardInterrupt):
        LOADS[component](path, engine)
    engine.close()
    assert engine.in_use == 0, "a staging buffer was not released"


def read_all(reader: StagingReader) -> None:
    for name in reader:
        reader.read(name, device=CPU)


def test_a_file_truncated_after_its_check_fails_naming_file_and_tensor(
    tmp_path: Path, nothing_left: None
) -> None:
    path = write_checkpoint({"a": torch.randn(300), "b": torch.randn(300)}, tmp_path)
    checkpoint = open_checkpoint(path)
    engine = DelayedEngine(0)
    reader = StagingReader(
        checkpoint, engine=engine, device=CPU, options=ReadOptions(staging_bytes=512)
    )
    os.truncate(path, checkpoint.tensors["a"].end + 8)
    with pytest.raises(CheckpointError) as caught:
        read_all(reader)
    engine.close()
    assert caught.value.file == str(path)
    assert engine.in_use == 0
    with pytest.raises(CheckpointError):  # a failed reader stays failed
        reader.read("b", device=CPU)


# --- the reader's own rules -------------------------------------------------------------------


def info(name: str, start: int, end: int, file: str = "a") -> TensorInfo:
    return TensorInfo(name, Path(file), torch.uint8, (end - start,), start, end)


def test_fills_split_large_tensors_and_pack_small_ones() -> None:
    tensors = [info("big", 0, 250), info("s1", 250, 260), info("s2", 260, 270)]
    fills = plan_fills(tensors, buffer_bytes=100)
    assert [f.start for f in fills] == [0, 100, 200]
    assert fills[2].segments == (
        Segment("big", 200, 50, 0),
        Segment("s1", 0, 10, 50),
        Segment("s2", 0, 10, 60),
    )
    assert fills[2].length == 70


def test_fills_never_hold_two_transients_nor_cross_files_or_gaps() -> None:
    tensors = [
        info("t1", 0, 10),
        info("t2", 10, 20),
        info("k", 20, 30),
        info("gap", 40, 50),
        info("other", 0, 10, file="b"),
    ]
    fills = plan_fills(tensors, buffer_bytes=100, transient={"t1", "t2"})
    assert [[s.name for s in f.segments] for f in fills] == [
        ["t1"],
        ["t2", "k"],
        ["gap"],
        ["other"],
    ]


def test_aligned_fills_start_on_the_alignment() -> None:
    fills = plan_fills([info("a", 10, 30), info("b", 30, 50)], buffer_bytes=16, align=16)
    assert [(f.start, f.length) for f in fills] == [(0, 16), (16, 16), (32, 16), (48, 2)]
    assert fills[0].segments == (Segment("a", 0, 6, 10),)


def test_the_reader_hands_each_tensor_out_once_in_order(tmp_path: Path, nothing_left: None) -> None:
    state = {"a": torch.randn(10), "empty": torch.empty(0), "b": torch.randn(5)}
    checkpoint = open_checkpoint(write_checkpoint(state, tmp_path))
    reader = StagingReader(checkpoint, engine=CpuEngine(), device=CPU, options=ReadOptions())
    with pytest.raises(ArgumentError, match="reads onto cpu"):
        reader.read("a", device=torch.device("meta"))
    reader = StagingReader(checkpoint, engine=CpuEngine(), device=CPU, options=ReadOptions())
    assert reader.fresh_names == frozenset(state)
    got = {name: reader.read(name, device=CPU) for name in reader}
    assert all(torch.equal(got[name], state[name]) for name in state)
    with pytest.raises(ArgumentError, match="read already"):
        reader.read("a", device=CPU)
    reader.close()
    with pytest.raises(ArgumentError, match="was closed"):
        reader.read("b", device=CPU)
    reader = StagingReader(checkpoint, engine=CpuEngine(), device=CPU, options=ReadOptions())
    reader.read("b", device=CPU)  # skips the names before it
    del reader  # dropped without close: joined and released all the same


def test_engines_for_devices_and_their_events() -> None:
    assert isinstance(engine_for(CPU), CpuEngine)
    with pytest.raises(ArgumentError, match="meta"):
        engine_for(torch.device("meta"))
    with pytest.raises(ArgumentError, match="CudaEngine"):
        CudaEngine(CPU)
    engine = CpuEngine(in_place=False)
    assert engine.streams == 1
    assert not engine.stages_in_place(CPU)
    buffer = engine.staging(4)
    assert buffer.nbytes == 4
    assert buffer.dtype == torch.uint8
    target = torch.zeros(4, dtype=torch.uint8)
    event = engine.copy(torch.arange(4, dtype=torch.uint8), target, stream=0)
    assert event.query()
    assert target.tolist() == [0, 1, 2, 3]
    engine.release(buffer)
    failed = CompletedCopy(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        failed.wait()


def test_the_delayed_engine_completes_copies_out_of_order() -> None:
    """Its copies run in the order of their random delays, not the order they were started (a
    seeded schedule: whatever the machine's load, the order is the delays')."""
    engine = DelayedEngine(1, max_delay=0.2)
    targets = [torch.zeros(1, dtype=torch.uint8) for _ in range(20)]
    events = [
        engine.copy(torch.tensor([n + 1], dtype=torch.uint8), t, stream=n % 2)
        for n, t in enumerate(targets)
    ]
    for event in events:
        event.wait()
    engine.close()
    assert sorted(engine.completed) == list(range(20))
    assert engine.completed != sorted(engine.completed), "every copy completed in order"
    assert [int(t) for t in targets] == list(range(1, 21))


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("staging_bytes", 0, "must be at least 1"),
        ("staging_buffers", True, "must be an int"),
        ("o_direct", 1, "must be a bool"),
    ],
)
def test_staging_options_are_checked(field: str, value: object, problem: str) -> None:
    with pytest.raises(ArgumentError, match=f"ReadOptions.{field} {problem}"):
        ReadOptions(**{field: value})  # type: ignore[arg-type]


def test_o_direct_needs_aligned_buffers() -> None:
    with pytest.raises(ArgumentError, match="multiple of 4096"):
        ReadOptions(o_direct=True, staging_bytes=1000)
    options = ReadOptions(staging_bytes=4096, staging_buffers=3)
    assert options.staging_bound == 3 * 4096
    assert replace(options, o_direct=True).staging_bound == 3 * 2 * 4096
