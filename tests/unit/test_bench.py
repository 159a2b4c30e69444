"""The benchmark's own machinery: the copy path it measures, its paths, ratios, JSON and tables.

Timings are never asserted here; only shapes, fates of bytes, page-cache states, and the
arithmetic of the ratios.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture
from torch import nn

from fakes.bench import BenchDiT, BenchShapes
from fakes.checkpoints import write_checkpoint
from fakes.layers import LINEAR_KINDS
from reference.__main__ import main
from reference.load.dit import DiTOptions, load_dit
from reference.place.adopt import ADOPTION_DISABLED, load_full_state
from reference.programs.bench import cache as bench_cache
from reference.programs.bench import limits as bench_limits
from reference.programs.bench import paths as bench_paths
from reference.programs.bench import runner as bench_runner
from reference.programs.bench.command import (
    BEST_READ,
    best_read,
    measure_size,
    parse_sizes,
    pressure_counters,
    tensors_in_flight,
    unavailable,
    write_folder,
)
from reference.programs.bench.ratios import RATIOS, compute_ratios
from reference.programs.bench.report import (
    format_document,
    format_pressure,
    plot_available,
    write_plot,
)
from reference.read.checkpoint import TensorReader, open_checkpoint
from reference.read.reading import ReadOptions
from reference.request.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
OFFLOAD = WeightLoadPlan(checkpoint_load_device=CPU)
ISSUE_RATIOS = {
    "diffusers_zero_copy_anon_over_checkpoint",
    "diffusers_offload_time_over_from_pretrained",
    "te_zero_copy_anon_over_checkpoint",
    "te_offload_time_over_from_pretrained",
    "cold_te_offload_time_over_cold_from_pretrained",
    "te_adopted_over_checkpoint",
    "guarded_meta_build_over_unguarded",
    "zero_copy_anon_over_checkpoint",
    "zero_copy_time_over_copy_time",
    "copy_throughput_over_readinto",
    "cold_copy_throughput_over_best_cold_read",
    "warm_copy_throughput_over_best_warm_read",
    "cold_zero_copy_resident_over_best_cold_read_time",
    "vae_stream_overhead_over_largest_tensor",
    "copy_path_refused_above_available_memory",
    "direct_dit_peak_device_over_model",
    "h2d_throughput_over_pinned_copy",
}
THREADS = range(1, 2 * (os.cpu_count() or 1) + 1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A benchmark folder at 1 MiB: shapes.json, dit/ and vae/ checkpoints."""
    path = tmp_path_factory.mktemp("bench") / "1mib"
    return path, write_folder(path, 1)


def _owns_storage(tensor: torch.Tensor) -> bool:
    return tensor.untyped_storage().nbytes() == tensor.nbytes


# --- the copy path (adoption disabled) ------------------------------------------------------------


def test_adopt_false_copies_every_tensor_into_its_own_storage(tmp_path: Path) -> None:
    shapes = BenchShapes(dit_hidden=64, dit_depth=2, vae_hidden=8)
    state = {k: torch.randn(v.shape).to(v.dtype) for k, v in _meta_state(shapes).items()}
    path = write_checkpoint(state, tmp_path)
    module, report = load_dit(
        shapes.dit, path, plan=OFFLOAD, kinds=LINEAR_KINDS, options=DiTOptions(adopt=False)
    )
    assert report.adopted == (0, 0)
    assert report.copied == (len(state), sum(t.nbytes for t in state.values()))
    assert {r.reason for r in report.records} == {ADOPTION_DISABLED}
    for name, tensor in module.state_dict().items():
        assert _owns_storage(tensor), name
        assert torch.equal(tensor, state[name]), name


def test_default_still_adopts_every_bench_linear(tmp_path: Path) -> None:
    shapes = BenchShapes(dit_hidden=64, dit_depth=2, vae_hidden=8)
    state = {name: torch.ones(s.shape, dtype=s.dtype) for name, s in _meta_state(shapes).items()}
    path = write_checkpoint(state, tmp_path)
    module, report = load_dit(shapes.dit, path, plan=OFFLOAD, kinds=LINEAR_KINDS)
    adopted = {r.name for r in report.records if r.how == "adopted"}
    assert {n for n in state if ".up." in n or ".down." in n} <= adopted
    # ZC-2b: plain parameters (the norms) are adopted as well; only buffers are copied.
    assert adopted == {name for name, _ in module.named_parameters()}
    assert not _owns_storage(module.blocks[0].up.weight)  # a view of the file's map


def _meta_state(shapes: BenchShapes) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return dict(shapes.dit().state_dict())


class Transposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(4, 3).t())


def test_a_non_contiguous_slot_keeps_its_strides_on_the_copy_path(tmp_path: Path) -> None:
    with torch.device("meta"):
        module = Transposed()
    value = torch.arange(12.0).reshape(3, 4)
    path = write_checkpoint({"weight": value}, tmp_path)
    reader = TensorReader(open_checkpoint(path))
    tensors = ((name, reader.read(name, device=CPU)) for name in reader)
    load_full_state(module, tensors, load_device=CPU, kinds=LINEAR_KINDS)
    assert module.weight.stride() == (1, 3)
    assert torch.equal(module.weight, value)


# --- the bench model and the measured paths ------------------------------------------------------


@pytest.mark.parametrize("mib", [1, 64, 512])
def test_bench_shapes_hit_the_requested_size(mib: int) -> None:
    shapes = BenchShapes.for_bytes(mib * 2**20)
    with torch.device("meta"):
        dit: BenchDiT = shapes.dit()
        vae = shapes.vae()
    for model in (dit, vae):
        total = sum(t.nbytes for t in model.state_dict().values())
        assert 0.8 * mib * 2**20 <= total <= 1.25 * mib * 2**20
    assert len(dit.blocks) >= 8


CPU_PATHS = [
    name
    for name, spec in bench_paths.PATHS.items()
    if not spec.cuda and unavailable(spec, None) is None
]
MOVES_NOTHING = ("dit_copy_refused", "wan14b_guarded", "wan14b_unguarded")
"""Paths that load no checkpoint: a refusal, and the constructions measured alone."""
CONVERTS = ("pipe_pretrained",)
"""Paths that convert some tensors to a narrower dtype (diffusers' torch_dtype: the VAE too)."""
LIMIT_FAMILIES = ("preadv_", "map_copy_")
"""Read limits at several thread counts: one count of each runs in the unit tier."""


def _in_unit(name: str, cache: str, mode: str) -> bool:
    if name.startswith(LIMIT_FAMILIES) and not name.endswith("_2"):
        return False
    return (cache, mode) == ("warm", "time") or name == "dit_copy"


CPU_RUNS = [(name, cache) for name in CPU_PATHS for cache in bench_paths.PATHS[name].caches]
CPU_CASES = [
    pytest.param(name, cache, mode, marks=() if _in_unit(name, cache, mode) else pytest.mark.long)
    for name, cache in CPU_RUNS
    for mode in bench_paths.MODES
]
"""Every CPU path in every cache state and mode: each loading path warm and timed in the unit
tier (the copy path in all four states and modes, the read limits at two threads), the rest in
`tox -e selftest`."""


@pytest.mark.parametrize(("path", "cache", "mode"), CPU_CASES)
def test_each_cpu_path_reports_its_figures(
    folder: tuple[Path, dict[str, Any]], path: str, cache: str, mode: str
) -> None:
    where, facts = folder
    result = bench_paths.run(bench_paths.Job(path, where, mode, cache=cache))
    assert (result["path"], result["mode"], result["cache"]) == (path, mode, cache)
    if "skipped" in result:  # a file system that keeps every page (tmpfs)
        assert cache == "cold"
        pytest.skip(result["skipped"])
    spec = bench_paths.PATHS[path]
    moved = result["adopted"] + result["copied"] + result["streamed"]
    # the refused copy path moves nothing (test_the_refused_copy_path_is_refused...), nor does
    # a construction alone
    least = 0 if path in MOVES_NOTHING else facts[spec.model]["bytes"]
    assert moved >= (least // 2 if path in CONVERTS else least)
    keys = {"anon_peak", "file_peak_read"} if mode == "memory" else {"load_s", "resident_s"}
    assert keys | {"cached"} <= set(result)
    timed_steps = path.startswith(("dit_", "ddit_zero_copy", "te_zero_copy"))
    if timed_steps and path != "dit_copy_refused" and mode == "time":
        steps = {"build_s", "read_s", "place_s"}
        assert steps <= set(result), "the reference load's steps are not in its figures"
        assert sum(result[k] for k in steps) <= result["load_s"]
    if cache == "cold":
        assert result["cached"] <= bench_cache.COLD_LIMIT
    assert all(math.isfinite(v) for v in result.values() if isinstance(v, (int, float)))


# --- page-cache states, read limits, the prefetch path -------------------------------------------


def test_a_job_starts_warm_unless_it_says_cold(folder: tuple[Path, dict[str, Any]]) -> None:
    where, _ = folder
    assert bench_paths.Job("readinto", where).cache == "warm"
    request = {"path": "readinto", "folder": str(where), "mode": "time", "warmup": None}
    assert bench_runner.job_of(request).cache == "warm"
    assert bench_runner.job_of(request | {"cache": "cold"}).cache == "cold"
    assert bench_cache.CACHES == ("warm", "cold")
    assert {spec.caches for spec in bench_paths.PATHS.values()} == {("warm", "cold"), ("warm",)}


def test_dropping_pages_leaves_a_written_file_out_of_the_page_cache(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4 << 20))
    bench_cache.make_warm([path])
    assert bench_cache.cached_fraction([path]) > 0.9
    reason = bench_cache.make_cold([path])
    if reason is not None:
        pytest.skip(f"this platform cannot drop pages: {reason}")
    assert bench_cache.cached_fraction([path]) <= bench_cache.COLD_LIMIT
    bench_cache.make_warm([path])
    assert bench_cache.cached_fraction([path]) > 0.9


def test_a_mapped_file_keeps_its_pages_and_the_cold_run_says_why(tmp_path: Path) -> None:
    import mmap

    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(1 << 20))
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE)) >= 0  # fault in
        reason = bench_cache.make_cold([path])
    assert reason is not None
    assert "POSIX_FADV_DONTNEED" in reason or "posix_fadvise" in reason


def test_without_posix_fadvise_cold_runs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "posix_fadvise")
    assert bench_cache.cannot_drop() == "os.posix_fadvise is not available here"
    assert bench_cache.make_cold([]) == "os.posix_fadvise is not available here"


def test_limit_rows_for_one_to_twice_the_cores() -> None:
    assert bench_limits.thread_counts() == THREADS
    limits = {name for name, spec in bench_paths.PATHS.items() if spec.limit}
    expected = {f"preadv_{n}" for n in THREADS} | {f"map_copy_{n}" for n in THREADS}
    assert limits == expected | {"readinto"}
    for n in THREADS:
        assert bench_paths.PATHS[f"preadv_{n}"].caches == ("warm", "cold")
        assert bench_paths.PATHS[f"map_copy_{n}"].caches == ("warm",)


@pytest.mark.parametrize("size", [0, 1, 4095, 10 << 20])
@pytest.mark.parametrize("threads", [1, 3, 4])
def test_shares_cover_the_file_once_in_order(size: int, threads: int) -> None:
    shares = bench_limits.shares(size, threads)
    assert len(shares) <= threads
    assert shares[0][0] == 0
    assert shares[-1][1] == size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(shares))


@pytest.mark.parametrize("read", ["readinto", "preadv", "map_copy"])
def test_each_limit_reads_every_byte_of_the_file(tmp_path: Path, read: str) -> None:
    path = tmp_path / "data.bin"
    data = os.urandom(3 * bench_limits.PREADV_CHUNK // 2 + 7)
    path.write_bytes(data)
    for threads in (1, 3):
        if read == "readinto":
            buffer = bench_limits.readinto(path)
        else:
            buffer = getattr(bench_limits, read)(path, threads)
        assert buffer.dtype == torch.uint8
        assert buffer.numpy().tobytes() == data


def test_limit_rows_report_the_whole_file(folder: tuple[Path, dict[str, Any]]) -> None:
    where, facts = folder
    for name in ("readinto", f"preadv_{THREADS[-1]}", f"map_copy_{THREADS[-1]}"):
        result = bench_paths.run(bench_paths.Job(name, where, "time"))
        assert result["copied"] == facts["dit"]["file_bytes"], name


def _fake_runner(cold: str | None = None) -> tuple[list[dict[str, Any]], Any]:
    """A runner that answers without running: load_s from the path's thread count, so the
    fastest limit is known; `cold` set: every cold run is refused with that reason."""
    jobs: list[dict[str, Any]] = []

    def answer(job: dict[str, Any]) -> dict[str, Any]:
        jobs.append(job)
        if cold is not None and job["cache"] == "cold":
            return {"path": job["path"], "cache": "cold", "skipped": cold}
        n = int(job["path"].rpartition("_")[2]) if job["path"][-1].isdigit() else 1
        speed = n if job["path"].startswith("preadv") else 1
        slower = 2.0 if job["cache"] == "cold" else 1.0
        return {"path": job["path"], "cache": job["cache"], "load_s": slower / speed} | {
            "resident_s": 1.0,
            "anon_peak": 1,
            "host_anon_bytes": 1,
            "device_peak": 1,
            "cached": 0.0 if job["cache"] == "cold" else 1.0,
            "adopted": 0,
            "copied": 1,
            "streamed": 0,
        }

    return jobs, answer


def _measure(folder: tuple[Path, dict[str, Any]], **options: Any) -> dict[str, Any]:
    where, facts = folder
    jobs, answer = options.pop("runner")
    size = measure_size(
        where, facts, reps=1, runner=answer, no_cuda="no CUDA", warmup=where, **options
    )
    size["jobs"] = jobs
    return size


def test_every_pair_is_measured_and_the_best_read_is_the_fastest_limit(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    size = _measure(folder, runner=_fake_runner())
    _, facts = folder
    paths = size["paths"]
    assert set(paths) == set(bench_paths.PATHS) | {BEST_READ}
    for name in CPU_PATHS:
        assert set(paths[name]) & {"warm", "cold"} == set(bench_paths.PATHS[name].caches), name
    assert "cold" not in paths["map_copy_1"]
    for n in THREADS:
        for cache in bench_paths.PATHS[f"preadv_{n}"].caches:
            assert paths[f"preadv_{n}"]["bytes"] == facts["dit"]["file_bytes"]
            assert paths[f"preadv_{n}"][cache]["throughput"] == pytest.approx(
                facts["dit"]["file_bytes"] * n / (2.0 if cache == "cold" else 1.0)
            )
    assert paths["dit_copy"]["bytes"] == facts["dit"]["bytes"]
    fastest = f"preadv_{THREADS[-1]}"
    assert paths[BEST_READ]["warm"]["of"] == fastest
    assert paths[BEST_READ]["cold"]["of"] == fastest
    assert paths[BEST_READ]["cold"]["load_s"] == pytest.approx(2.0 / THREADS[-1])
    assert size["vae_tensors_in_flight"] == tensors_in_flight()
    modes = {(j["path"], j["cache"], j["mode"]) for j in size["jobs"]}
    assert ("dit_copy", "cold", "memory") in modes
    assert not any(j["path"] == "dit_direct" for j in size["jobs"])


def test_cache_warm_measures_warm_only(folder: tuple[Path, dict[str, Any]]) -> None:
    size = _measure(folder, runner=_fake_runner(), caches=("warm",))
    assert {j["cache"] for j in size["jobs"]} == {"warm"}
    assert all("cold" not in row for row in size["paths"].values())
    cold = size["ratios"]["cold_copy_throughput_over_best_cold_read"]
    assert cold["status"] == "skipped"
    assert cold["reason"] == "dit_copy_pool cold: not measured in this run"
    assert size["ratios"]["warm_copy_throughput_over_best_warm_read"]["status"] != "skipped"


def test_cold_runs_that_cannot_drop_pages_are_skipped_with_the_reason(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    size = _measure(folder, runner=_fake_runner(cold="pages stayed"))
    assert size["paths"]["dit_copy"]["cold"] == {"skipped": "pages stayed"}
    assert "cold" not in size["paths"][BEST_READ]
    assert "throughput" in size["paths"]["dit_copy"]["warm"]
    # one refused cold run per path: it is not tried again in the other mode or repetition
    cold = [j for j in size["jobs"] if j["cache"] == "cold"]
    assert len(cold) == len({j["path"] for j in cold})
    reason = size["ratios"]["cold_copy_throughput_over_best_cold_read"]["reason"]
    assert reason == "dit_copy_pool cold: pages stayed"


def test_the_pool_and_prefetch_paths_pass_their_read_options(
    folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    real_load_dit, real_load_vae = bench_paths.load_dit, bench_paths.load_vae

    def load_dit(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["options"].reading if "options" in kwargs else None)
        return real_load_dit(*args, **kwargs)

    def load_vae(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["options"].reading if "options" in kwargs else None)
        return real_load_vae(*args, **kwargs)

    monkeypatch.setattr(bench_paths, "load_dit", load_dit)
    monkeypatch.setattr(bench_paths, "load_vae", load_vae)
    where, facts = folder
    prefetched = bench_paths.run(bench_paths.Job("dit_zero_copy_prefetch", where, "time"))
    pooled = bench_paths.run(bench_paths.Job("dit_copy_pool", where, "time"))
    mapped = bench_paths.run(bench_paths.Job("dit_copy", where, "time"))
    streamed = bench_paths.run(bench_paths.Job("vae_stream_pool", where, "time"))
    assert prefetched["adopted"] > 0.99 * facts["dit"]["bytes"]
    assert pooled["copied"] == mapped["copied"] == facts["dit"]["bytes"]
    assert streamed["streamed"] == facts["vae"]["bytes"]
    # the copy path's default is the pool (None); the map path asks for no workers
    assert seen == [ReadOptions(prefetch=True), None, ReadOptions(workers=0), ReadOptions()]
    assert tensors_in_flight() == ReadOptions().max_tensors


def test_zero_copy_adopts_and_the_copy_path_copies(folder: tuple[Path, dict[str, Any]]) -> None:
    where, facts = folder
    zero = bench_paths.run(bench_paths.Job("dit_zero_copy", where, "time"))
    copy = bench_paths.run(bench_paths.Job("dit_copy", where, "time"))
    assert zero["adopted"] > 0.99 * facts["dit"]["bytes"]
    assert copy["copied"] == facts["dit"]["bytes"]


def test_diffusers_paths_load_the_same_dit_and_zero_copy_adopts_it(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    reason = bench_paths.library_missing("diffusers")
    if reason is not None:
        pytest.skip(reason)
    where, facts = folder
    zero = bench_paths.run(bench_paths.Job("ddit_zero_copy", where, "time"))
    pretrained = bench_paths.run(bench_paths.Job("ddit_pretrained", where, "time"))
    assert zero["adopted"] >= 0.99 * facts["ddit"]["bytes"]
    # from_pretrained reports no fates: bytes still mapped from the file count as adopted.
    assert pretrained["adopted"] + pretrained["copied"] >= facts["ddit"]["bytes"]


def test_text_encoder_paths_load_the_same_encoder_and_zero_copy_adopts_it(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    reason = bench_paths.library_missing("transformers")
    if reason is not None:
        pytest.skip(reason)
    where, facts = folder
    zero = bench_paths.run(bench_paths.Job("te_zero_copy", where, "time"))
    pretrained = bench_paths.run(bench_paths.Job("te_pretrained", where, "time"))
    assert zero["adopted"] >= 0.99 * facts["te"]["bytes"]
    # from_pretrained reports no fates: bytes still mapped from the file count as adopted.
    assert pretrained["adopted"] + pretrained["copied"] >= facts["te"]["bytes"]


def test_diffusers_paths_are_skipped_with_the_extra_named_without_diffusers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "diffusers", None)
    reason = bench_paths.library_missing("diffusers")
    assert reason is not None
    assert "[diffusers]" in reason
    assert bench_paths.library_missing(None) is None


def test_paths_command_line(
    folder: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    where = str(folder[0])
    assert bench_runner.main(["dit_zero_copy", where, "--mode", "memory", "--warmup", where]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["path"], result["mode"]) == ("dit_zero_copy", "memory")
    with pytest.raises(SystemExit):
        bench_runner.main(["no_such_path", where])


def test_runs_are_spawned_once_cuda_is_initialised(tmp_path: Path, mocker: MockerFixture) -> None:
    """A forked child cannot use CUDA its parent initialised ("Cannot re-initialize CUDA in
    forked subprocess"): once CUDA is initialised in the runner, every run goes to a fresh
    interpreter. (Nothing is forked here: a fork of a test worker's threads can hang.)"""
    job = bench_paths.Job("dit_zero_copy", tmp_path)
    spawned = mocker.patch.object(bench_runner, "spawned", return_value={"path": "spawned"})
    forked = mocker.patch.object(bench_runner, "forked", return_value={"path": "forked"})
    assert bench_runner.isolated(job) == {"path": "forked"}, "a CPU run without CUDA is forked"
    mocker.patch.object(torch.cuda, "is_initialized", return_value=True)
    assert bench_runner.isolated(job) == {"path": "spawned"}
    assert (forked.call_count, spawned.call_count) == (1, 1)


@pytest.mark.long  # a fresh interpreter per run
def test_a_spawned_run_gives_the_figures_of_a_run_in_process(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    where, _ = folder
    job = bench_paths.Job("dit_zero_copy", where, "time")
    spawned = bench_runner.spawned(job)
    assert "error" not in spawned, spawned.get("error")
    assert set(spawned) == set(bench_paths.run(job))
    assert (spawned["path"], spawned["mode"], spawned["cache"]) == ("dit_zero_copy", "time", "warm")


def test_a_cuda_path_is_spawned_even_before_cuda_is_initialised(
    tmp_path: Path, mocker: MockerFixture
) -> None:
    name = next(name for name, spec in bench_paths.PATHS.items() if spec.cuda)
    spawned = mocker.patch.object(bench_runner, "spawned", return_value={"path": name})
    forked = mocker.patch.object(bench_runner, "forked")
    assert bench_runner.isolated(bench_paths.Job(name, tmp_path)) == {"path": name}
    spawned.assert_called_once()
    forked.assert_not_called()


def test_preload_imports_what_the_paths_import_lazily() -> None:
    """The server imports once what every forked child would otherwise import (and grow by)."""
    bench_runner.preload()
    if bench_paths.library_missing("diffusers") is None:
        assert "diffusers.models.transformers" in sys.modules


def test_a_spawned_run_that_fails_says_why(tmp_path: Path) -> None:
    result = bench_runner.spawned(bench_paths.Job("dit_zero_copy", tmp_path / "missing"))
    assert result["path"] == "dit_zero_copy"
    assert "shapes.json" in result["error"]


# --- ratios, tables, the command ----------------------------------------------------------------


def _size(**paths: dict[str, Any]) -> dict[str, Any]:
    """A size's figures by hand: each keyword is a path, {"bytes", "warm", "cold"}."""
    facts = {"bytes": 1000, "largest_tensor_bytes": 100, "tensors": 10, "file_bytes": 1008}
    base = {name: {"skipped": "no CUDA device"} for name in [*bench_paths.PATHS, BEST_READ]}
    return {
        "size_mib": 1,
        "dit": facts,
        "vae": facts,
        "ddit": facts,
        "te": facts,
        "vae_tensors_in_flight": 1,
        "paths": base | {name: {"bytes": 1000} | row for name, row in paths.items()},
    }


def test_ratios_read_their_figures_and_judge_their_targets() -> None:
    size = _size(
        dit_zero_copy={"warm": {"anon_peak": 10, "load_s": 0.1}, "cold": {"resident_s": 2.0}},
        dit_copy={"warm": {"load_s": 1.0}, "cold": {"load_s": 2.0}},
        dit_copy_pool={"warm": {"load_s": 1.0}, "cold": {"load_s": 2.0}},
        dit_copy_refused={"warm": {"anon_peak": 5}},
        readinto={"warm": {"load_s": 0.5}, "cold": {"load_s": 1.6}},
        # the best read: 1000 bytes in 0.8 s warm (1250 B/s), in 1.6 s cold (625 B/s)
        best_read={"warm": {"load_s": 0.8, "of": "preadv_2"}, "cold": {"load_s": 1.6}},
        vae_stream={"warm": {"anon_peak": 1100, "host_anon_bytes": 1000}},
        vae_ordinary={"warm": {"anon_peak": 2000, "host_anon_bytes": 1000}},
        ddit_zero_copy={"warm": {"load_s": 0.3, "anon_peak": 1}},
        ddit_pretrained={"warm": {"load_s": 0.2, "anon_peak": 900}},
        wan14b_guarded={"warm": {"load_s": 0.36}},
        wan14b_unguarded={"warm": {"load_s": 0.3}},
        te_zero_copy={"warm": {"load_s": 0.05, "anon_peak": 1, "adopted": 1000}},
        te_pretrained={"warm": {"load_s": 0.2, "anon_peak": 1100}},
    )
    ratios = compute_ratios(size)
    assert ratios["te_offload_time_over_from_pretrained"]["status"] == "pass"
    assert ratios["te_adopted_over_checkpoint"]["value"] == 1.0
    assert ratios["cold_te_offload_time_over_cold_from_pretrained"]["status"] == "skipped"
    assert set(ratios) == {r.name for r in RATIOS}
    guard = ratios["guarded_meta_build_over_unguarded"]
    assert (guard["value"], guard["target"], guard["status"]) == (pytest.approx(1.2), 1.1, "miss")
    assert set(ratios) >= ISSUE_RATIOS
    assert ratios["zero_copy_anon_over_checkpoint"] == {
        "value": 0.01,
        "target": 0.02,
        "op": "<=",
        "pass": True,
        "status": "pass",
    }
    assert ratios["zero_copy_time_over_copy_time"]["status"] == "miss"  # 0.1 > 0.05
    assert ratios["copy_throughput_over_readinto"]["value"] == pytest.approx(0.5)
    assert ratios["copy_throughput_over_readinto"]["status"] == "info"
    warm = ratios["warm_copy_throughput_over_best_warm_read"]
    assert (warm["value"], warm["status"]) == (pytest.approx(0.8), "miss")  # 1000/1 over 1250
    cold = ratios["cold_copy_throughput_over_best_cold_read"]
    assert (cold["value"], cold["status"]) == (pytest.approx(0.8), "miss")  # 500 over 625
    for cache in ("cold", "warm"):
        mapped = ratios[f"{cache}_map_copy_throughput_over_best_{cache}_read"]
        assert (mapped["value"], mapped["status"]) == (pytest.approx(0.8), "info")
    refused = ratios["copy_path_refused_above_available_memory"]
    assert (refused["value"], refused["status"]) == (pytest.approx(0.005), "pass")
    # 2.0 s until resident over 1000 bytes at the best cold read's 625 B/s (1.6 s)
    lazy = ratios["cold_no_prefetch_resident_over_best_cold_read_time"]
    assert (lazy["value"], lazy["status"]) == (pytest.approx(1.25), "info")
    prefetch = ratios["cold_zero_copy_resident_over_best_cold_read_time"]
    assert prefetch["status"] == "skipped"
    assert prefetch["reason"] == "dit_zero_copy_prefetch: no CUDA device"
    pool = ratios["vae_pool_overhead_over_largest_tensor"]
    assert pool["reason"] == "vae_stream_pool: no CUDA device"
    assert ratios["vae_stream_overhead_over_largest_tensor"]["value"] == pytest.approx(1.0)
    assert ratios["vae_stream_overhead_over_largest_tensor"]["target"] == pytest.approx(1.5)
    assert ratios["vae_ordinary_overhead_over_largest_tensor"]["status"] == "info"
    offload = ratios["diffusers_offload_time_over_from_pretrained"]
    assert (offload["value"], offload["target"], offload["status"]) == (
        pytest.approx(1.5),
        0.8,
        "miss",
    )
    skipped = ratios["h2d_throughput_over_pinned_copy"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "dit_direct: no CUDA device"


def test_the_cold_targets_pass_at_the_best_read_and_the_vae_target_follows_k() -> None:
    size = _size(
        dit_copy_pool={"cold": {"load_s": 1.0}, "warm": {"load_s": 0.5}},
        dit_zero_copy_prefetch={"cold": {"resident_s": 1.05}},
        best_read={"cold": {"load_s": 1.0}, "warm": {"load_s": 0.5}},
        vae_stream_pool={"warm": {"anon_peak": 3400, "host_anon_bytes": 1000}},
    )
    size["vae_tensors_in_flight"] = 4
    ratios = compute_ratios(size)
    for name in (
        "cold_copy_throughput_over_best_cold_read",
        "warm_copy_throughput_over_best_warm_read",
        "cold_zero_copy_resident_over_best_cold_read_time",
    ):
        assert ratios[name]["status"] == "pass", name
    assert ratios["cold_zero_copy_resident_over_best_cold_read_time"]["value"] == pytest.approx(
        1.05
    )
    vae = ratios["vae_pool_overhead_over_largest_tensor"]
    assert (vae["value"], vae["target"], vae["status"]) == (pytest.approx(24.0), 4.5, "miss")


def test_a_skipped_cache_state_skips_its_ratios_with_the_reason() -> None:
    size = _size(
        dit_copy_pool={"warm": {"load_s": 1.0}, "cold": {"skipped": "pages stayed"}},
        best_read={"warm": {"load_s": 1.0}},
    )
    ratios = compute_ratios(size)
    assert ratios["cold_copy_throughput_over_best_cold_read"]["reason"] == (
        "dit_copy_pool cold: pages stayed"
    )
    assert ratios["warm_copy_throughput_over_best_warm_read"]["status"] == "pass"


def test_the_refused_copy_path_is_refused_and_holds_nothing(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    result = bench_paths.run(bench_paths.Job("dit_copy_refused", folder[0], "memory"))
    assert result["copied"] == 0
    assert result["anon_peak"] < 0.02 * folder[1]["dit"]["bytes"]


def test_best_read_is_the_largest_throughput_of_the_limit_rows() -> None:
    paths = {
        "readinto": {"limit": True, "warm": {"throughput": 2.0, "runs": []}},
        "preadv_2": {"limit": True, "warm": {"throughput": 3.0}, "cold": {"throughput": 1.0}},
        "map_copy_2": {"limit": True, "warm": {"throughput": 2.5}},
        "dit_copy": {"limit": False, "warm": {"throughput": 9.0}},
        "preadv_4": {"limit": True, "cold": {"skipped": "pages stayed"}},
    }
    assert best_read(paths, "warm") == {"throughput": 3.0, "of": "preadv_2"}
    assert best_read(paths, "cold") == {"throughput": 1.0, "of": "preadv_2"}
    assert best_read({}, "cold") is None


def test_cuda_ratios_with_their_model_dependent_target() -> None:
    size = _size(
        dit_direct={"warm": {"device_peak": 1050, "load_s": 1.0}},
        pinned_h2d={"warm": {"load_s": 0.5}},
    )
    ratios = compute_ratios(size)
    assert ratios["direct_dit_peak_device_over_model"]["target"] == pytest.approx(1.1)
    assert ratios["direct_dit_peak_device_over_model"]["status"] == "pass"
    assert ratios["h2d_throughput_over_pinned_copy"]["status"] == "miss"


def test_sizes_are_parsed_sorted_and_checked() -> None:
    assert parse_sizes("256,64,256") == (64, 256)
    for bad in ("a,b", "0", ""):
        with pytest.raises(Exception, match="--sizes"):
            parse_sizes(bad)


@pytest.mark.long  # the benchmark end to end, in fresh processes
def test_bench_command_writes_the_json_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.json"
    assert main(["bench", "--size-mib", "1", "--reps", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert {"schema", "command", "machine", "repetitions", "sizes", "ratios"} <= set(document)
    assert [s["size_mib"] for s in document["sizes"]] == [1]
    assert set(document["ratios"]) >= ISSUE_RATIOS
    for name, ratio in document["ratios"].items():
        assert ratio["status"] in {"pass", "miss", "info", "skipped"}, name
        assert ratio["status"] == "skipped" or math.isfinite(ratio["value"]), name
        assert name in printed
    for size in document["sizes"]:
        assert set(size["paths"]) == set(bench_paths.PATHS) | {BEST_READ}
        for name, cache in CPU_RUNS:
            figures = size["paths"][name][cache]
            if "skipped" in figures:  # a file system that keeps every page (tmpfs)
                assert cache == "cold"
                continue
            for key in ("load_s", "resident_s", "anon_peak", "file_peak", "throughput", "cached"):
                assert math.isfinite(figures[key]), (name, cache, key)
            # Each real run started in its page-cache state (`--cache warm` alone is judged
            # below, with a runner that answers without running).
            if cache == "warm":
                assert figures["cached"] > 0.9, name
            else:
                assert figures["cached"] <= bench_cache.COLD_LIMIT, name
    assert format_document(document) in printed
    machine = document["machine"]
    assert {"load_average", "load_average_after"} <= set(machine)
    assert f"{machine['load_average_after'][0]:.2f} after" in printed
    if Path("/proc/vmstat").exists():
        assert set(machine["pressure_before"]) == set(machine["pressure_after"])
        assert "memory pressure during the run (/proc/vmstat): compact_stall " in printed


def test_pressure_counters_are_read_off_vmstat_and_printed_as_deltas(tmp_path: Path) -> None:
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 10\ncompact_stall 5\nallocstall_movable 7\n")
    before = pressure_counters(vmstat)
    assert before == {"compact_stall": 5, "allocstall_movable": 7}  # only the kernel's own
    assert pressure_counters(tmp_path / "missing") == {}
    after = {"compact_stall": 9, "allocstall_movable": 7}
    text = format_pressure({"pressure_before": before, "pressure_after": after})
    assert (
        text
        == "; memory pressure during the run (/proc/vmstat): compact_stall 4, allocstall_movable 0"
    )
    assert format_pressure({"pressure_before": {}, "pressure_after": {}}) == ""
    assert format_pressure({}) == ""


def test_the_bench_command_writes_the_figures_its_runner_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command's own flow (folders, every path, the table, the JSON) with a runner that
    answers without running: the end-to-end run in fresh processes is the selftest tier's."""
    from reference.programs.bench.command import bench_command

    jobs, answer = _fake_runner()
    out = tmp_path / "out.json"
    argv = ["--size-mib", "1", "--reps", "1", "--cache", "warm", "--json", str(out)]
    assert bench_command(argv, runner=answer) == 0
    (size,) = json.loads(out.read_text())["sizes"]
    assert size["caches"] == ["warm"]
    assert {job["cache"] for job in jobs} == {"warm"}
    assert {job["path"] for job in jobs} >= {"dit_zero_copy", "dit_copy", "vae_stream"}
    assert "python -m reference bench --size-mib 1" in capsys.readouterr().out


def test_several_sizes_add_a_growth_table() -> None:
    small = _size(readinto={"warm": {"anon_peak": 1024**2, "load_s": 0.5}})
    large = _size(readinto={"bytes": 4000, "warm": {"anon_peak": 4 * 1024**2, "load_s": 2.0}})
    large["size_mib"] = 4
    for size in (small, large):
        size["ratios"] = compute_ratios(size)
    machine = {"platform": "p", "cpus": 2, "torch_threads": 2, "load_average": [1.0]}
    document = {
        "command": "python -m reference bench --sizes 1,4",
        "repetitions": 1,
        "machine": machine | {"load_average_after": [1.0]},
        "sizes": [small, large],
        "ratios": large["ratios"],
    }
    text = format_document(document)
    growth = text[text.index("## growth with checkpoint size") :]
    assert "       1 MiB        4 MiB" in growth
    assert "readinto               warm  anon MiB         1.000        4.000" in growth


def test_plot_without_matplotlib_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if plot_available():
        pytest.skip("matplotlib is installed")
    assert main(["bench", "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    small = _size(dit_copy={"warm": {"anon_peak": 5, "load_s": 1}, "cold": {"load_s": 2}})
    large = _size(dit_copy={"warm": {"anon_peak": 20, "load_s": 4}, "cold": {"load_s": 8}})
    large["size_mib"] = 4
    write_plot({"command": "bench", "sizes": [small, large]}, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_beyond_ram_writes_shards_one_at_a_time_and_loads_them_zero_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reference.programs.bench import beyond_ram

    assert beyond_ram.main([str(tmp_path), "--gib", "0.004", "--shard-gib", "0.001"]) == 0
    figures = json.loads(capsys.readouterr().out)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 3
    assert figures["checkpoint_bytes"] == sum(p.stat().st_size for p in shards)
    assert figures["copied_bytes"] == 0
    assert figures["adopted_bytes"] > 0.99 * figures["checkpoint_bytes"]
    assert figures["copy_path"] == "loaded (it fitted in memory)"
    index = beyond_ram.write_sharded(tmp_path, target=1, shard_bytes=1)  # kept: not rewritten
    assert index == tmp_path / beyond_ram.INDEX
    assert sorted(tmp_path.glob("model-*.safetensors")) == shards
