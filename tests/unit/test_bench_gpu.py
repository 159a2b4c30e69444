"""The GPU table's machinery, exercised on the CPU: every row end to end with the device "cpu",
the table with its ratios and verdict lines, the file-to-device limits' reads, the command's
refusal without CUDA, and the summary `.ci/gpu-check.sh` ends with.

Timings are never asserted; figures only a CUDA device gives (device memory) are absent here and
their ratios skipped with the reason.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from pytest_mock import MockerFixture

from fakes.platform import FakePlatform
from reference.programs.bench import gpu, gpu_check, gpu_limits, gpu_ratios, gpu_rows
from reference.programs.bench.command import bench_command
from reference.programs.bench.gpu_report import format_gpu_document, verdicts
from reference.programs.bench.wan import TINY_WAN, WAN_1_3B
from reference.read.reading import ReadOptions
from reference.request.platform import describe

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
TARGETS = {r.name for r in gpu_ratios.GPU_RATIOS if r.op}
ISSUE_TARGETS = {
    "wan_direct_over_file_to_gpu_limit_warm",
    "wan_direct_over_file_to_gpu_limit_cold",
    "wan_direct_over_best_peer_warm",
    "wan_direct_over_best_peer_cold",
    "wan_direct_peak_device_over_model",
    "wan_direct_host_growth_over_staging_bound",
    "vae_stream_host_growth_over_staging_bound",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A GPU table folder: the bench's DiT and VAE at 1 MiB and, with diffusers, a tiny Wan."""
    path = tmp_path_factory.mktemp("bench-gpu") / "table"
    return path, gpu.write_gpu_folder(path, size_mib=1, wan=TINY_WAN)


def _in_process(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [gpu_rows.run_row(gpu_rows.job_of(request)) for request in requests]


def _runnable(name: str, facts: dict[str, Any]) -> None:
    row = gpu_rows.GPU_ROWS[name]
    reason = gpu_rows.unavailable(row, CPU)
    if row.model not in facts:
        reason = f"no {row.model} checkpoint: diffusers is not installed"
    if reason is not None:
        pytest.skip(reason)


# --- every row, end to end, on the CPU ----------------------------------------------------------


@pytest.mark.parametrize("name", list(gpu_rows.GPU_ROWS))
def test_each_row_runs_end_to_end_on_the_cpu(
    folder: tuple[Path, dict[str, Any]], name: str
) -> None:
    where, facts = folder
    _runnable(name, facts)
    row = gpu_rows.GPU_ROWS[name]
    cache = row.caches[0]
    for mode in row.modes:
        job = gpu_rows.GpuJob(row=name, folder=where, device="cpu", mode=mode, cache=cache)
        result = gpu_rows.run_row(
            gpu_rows.job_of(gpu_rows.as_request(job) | {"warmup": str(where)})
        )
        if "skipped" in result:  # cold, or O_DIRECT, on a file system that keeps every page
            pytest.skip(result["skipped"])
        assert (result["row"], result["mode"], result["cache"]) == (name, mode, cache)
        model = facts[row.model]
        whole = row.kind in ("limit", "h2d")
        assert result["device_bytes"] >= model["file_bytes" if whole else "bytes"]
        assert "device_peak" not in result  # only CUDA gives it
        assert {"load_s", "load_cpu_s"} <= set(result) if mode == "time" else "anon_peak" in result


def test_the_wan_checkpoint_is_written_as_from_pretrained_gives_it(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    where, facts = folder
    if "wan" not in facts:
        pytest.skip("diffusers is not installed")
    from safetensors import safe_open

    config = json.loads((where / "wan" / "transformer" / "config.json").read_text())
    assert config["_class_name"] == "WanTransformer3DModel"
    assert config["num_layers"] == TINY_WAN["num_layers"]
    (path,) = gpu_rows.files_of(where, "wan")
    with safe_open(str(path), "pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
    assert dtypes["scale_shift_table"] == "F32"  # one of the class's fp32-kept modules
    assert dtypes["blocks.0.ffn.net.0.proj.weight"] == "BF16"
    index = json.loads((where / "wan" / "model_index.json").read_text())
    assert index["transformer"] == ["diffusers", "WanTransformer3DModel"]


def test_the_limits_read_the_wan_files_or_without_them_the_benchs_dit(tmp_path: Path) -> None:
    (tmp_path / "dit").mkdir()
    assert gpu_rows.files_of(tmp_path, "limit") == (tmp_path / "dit" / "model.safetensors",)
    (tmp_path / "wan" / "transformer").mkdir(parents=True)
    shard = tmp_path / "wan" / "transformer" / "diffusion_pytorch_model.safetensors"
    shard.write_bytes(b"")
    assert gpu_rows.files_of(tmp_path, "limit") == (shard,)


def test_the_real_wan_config_is_wan2_1_t2v_1_3b() -> None:
    expected = {"num_layers": 30, "num_attention_heads": 12, "ffn_dim": 8960, "text_dim": 4096}
    assert expected.items() <= WAN_1_3B.items()
    assert WAN_1_3B["num_attention_heads"] * WAN_1_3B["attention_head_dim"] == 1536
    assert (WAN_1_3B["in_channels"], WAN_1_3B["out_channels"], WAN_1_3B["freq_dim"]) == (
        16,
        16,
        256,
    )
    assert WAN_1_3B["patch_size"] == (1, 2, 2)


# --- the table, its ratios and verdicts ---------------------------------------------------------


def test_the_table_on_the_cpu_computes_every_ratio_and_a_verdict_per_target(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    where, facts = folder
    if "wan" not in facts:
        pytest.skip("diffusers is not installed: no Wan rows")
    table = gpu.measure_table(
        where, facts, reps=1, runner=_in_process, device="cpu", warmup=where, caches=("warm",)
    )
    ratios = table["ratios"]
    assert set(ratios) == {r.name for r in gpu_ratios.GPU_RATIOS}
    assert TARGETS >= ISSUE_TARGETS
    assert table["failed"] == []
    paths = table["paths"]
    assert paths["best_limit"]["warm"]["of"].startswith("staged_")
    assert paths["best_peer_wan"]["warm"]["of"] in {"wan_load_file", "wan_from_pretrained"}
    for name in ("wan_direct", "dit_direct", "vae_stream"):
        assert "anon_peak" in paths[name]["warm"], name
        assert ratios[f"{name}_host_growth_over_staging_bound"]["status"] in {"pass", "miss"}
        peak = ratios[f"{name}_peak_device_over_model"]
        assert peak["status"] == "skipped"
        assert peak["reason"] == f"{name} warm: no device_peak figure on this device"
    for model in ("wan", "dit"):
        assert ratios[f"{model}_direct_over_file_to_gpu_limit_warm"]["status"] in {"pass", "miss"}
        assert ratios[f"{model}_direct_over_best_peer_warm"]["status"] in {"pass", "miss"}
        cold = ratios[f"{model}_direct_over_best_peer_cold"]
        assert cold["reason"] == f"{model}_direct cold: not measured in this run"
    lines = verdicts(ratios)
    assert len(lines) == len(TARGETS)
    assert all(
        line.split(": ")[1].split(" (")[0] in {"met", "missed", "not measured"} for line in lines
    )
    assert table["staging_bound"] == ReadOptions().staging_bound


def _answer(errors: frozenset[str] = frozenset()) -> tuple[list[list[dict[str, Any]]], Any]:
    """A runner that runs nothing: fixed figures (limits fastest with most threads), or an
    error for the rows in `errors`; it keeps each call's requests."""
    calls: list[list[dict[str, Any]]] = []

    def one(job: dict[str, Any]) -> dict[str, Any]:
        if job["row"] in errors:
            return {"row": job["row"], "error": "Traceback ...\nRuntimeError: boom"}
        threads = int(job["row"].rpartition("_")[2]) if job["row"][-1].isdigit() else 1
        figures = {"load_s": 1.0 / threads, "device_peak": 10, "device_bytes": 1, "cached": 1.0}
        if job["mode"] == "memory":
            figures = {"anon_peak": 5, "anon_end": 1, "device_peak": 10, "cached": 1.0}
        return {"row": job["row"], "mode": job["mode"], "cache": job["cache"]} | figures

    def answer(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        calls.append(list(jobs))
        return [one(job) for job in jobs]

    return calls, answer


def test_each_row_runs_timed_in_each_cache_and_sampled_once(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    where, facts = folder
    calls, answer = _answer()
    gpu.measure_table(where, facts, reps=2, runner=answer, device="cuda:0")
    ran = [(j["row"], j["cache"], j["mode"]) for jobs in calls for j in jobs]
    assert ran.count(("dit_direct", "warm", "time")) == 2
    assert ("dit_direct", "cold", "memory") not in ran
    assert {j["device"] for jobs in calls for j in jobs} == {"cuda:0"}
    staged = gpu_rows.GPU_ROWS["staged_direct_1"]
    assert gpu.modes_for(staged, "cold", ("warm", "cold")) == ("time",)
    assert gpu.modes_for(gpu_rows.GPU_ROWS["wan_direct"], "cold", ("cold",)) == ("time", "memory")
    assert gpu.modes_for(gpu_rows.GPU_ROWS["wan_direct"], "cold", ("cold",), ("time",)) == ("time",)
    # a process per run, but the limit rows' runs share one per repetition
    shared = [jobs for jobs in calls if len(jobs) > 1]
    assert len(shared) == 2
    for jobs in shared:
        assert all(gpu_rows.GPU_ROWS[j["row"]].shares_process for j in jobs)
    assert all(
        not gpu_rows.GPU_ROWS[jobs[0]["row"]].shares_process for jobs in calls if len(jobs) == 1
    )


def test_a_failed_row_is_shown_failed_and_not_run_again(
    folder: tuple[Path, dict[str, Any]],
) -> None:
    where, facts = folder
    calls, answer = _answer(errors=frozenset({"dit_direct"}))
    table = gpu.measure_table(where, facts, reps=2, runner=answer, device="cuda:0")
    assert [j["row"] for jobs in calls for j in jobs].count("dit_direct") == 1
    assert table["failed"] == ["dit_direct"]
    assert table["paths"]["dit_direct"]["skipped"] == "failed: RuntimeError: boom"
    ratio = table["ratios"]["dit_direct_peak_device_over_model"]
    assert ratio["reason"] == "dit_direct: failed: RuntimeError: boom"


def _table(**rows: dict[str, Any]) -> dict[str, Any]:
    """A table by hand: models of 100 MiB (largest tensor 10 MiB) and the rows given."""
    facts = {"bytes": 100 << 20, "file_bytes": 100 << 20, "largest_tensor_bytes": 10 << 20}
    return {"dit": facts, "vae": facts, "wan": facts, "staging_bound": 64 << 20, "paths": rows}


def test_ratios_read_their_figures_and_judge_their_targets() -> None:
    mib = 1 << 20
    table = _table(
        wan_direct={
            "warm": {"load_s": 1.0, "device_peak": 111 * mib, "anon_peak": 80 * mib},
            "cold": {"load_s": 3.0},
        },
        best_limit={"warm": {"throughput": 100 * mib}, "cold": {"throughput": 50 * mib}},
        best_peer_wan={"warm": {"load_s": 2.0}, "cold": {"load_s": 2.5}},
        vae_stream={"warm": {"device_peak": 113 * mib, "anon_peak": 70 * mib}},
        pinned_h2d={"warm": {"load_s": 0.5, "throughput": 200 * mib}},
    )
    ratios = gpu_ratios.compute_gpu_ratios(table)
    warm = ratios["wan_direct_over_file_to_gpu_limit_warm"]
    assert (warm["value"], warm["target"], warm["status"]) == (pytest.approx(1.0), 1.1, "pass")
    cold = ratios["wan_direct_over_file_to_gpu_limit_cold"]
    assert (cold["value"], cold["status"]) == (pytest.approx(1.5), "miss")
    peer = ratios["wan_direct_over_best_peer_warm"]
    assert (peer["value"], peer["target"], peer["status"]) == (pytest.approx(0.5), 0.8, "pass")
    peer = ratios["wan_direct_over_best_peer_cold"]
    assert (peer["value"], peer["target"], peer["status"]) == (pytest.approx(1.2), 1.0, "miss")
    # model 100 MiB + largest 10 MiB + 2 MiB of slack: 112 MiB
    wan_peak, vae_peak = (
        ratios[f"{r}_peak_device_over_model"] for r in ("wan_direct", "vae_stream")
    )
    assert wan_peak["target"] == pytest.approx(1.12)
    assert (wan_peak["status"], vae_peak["status"]) == ("pass", "miss")
    # staging 64 MiB + largest 10 MiB: 74 MiB
    host = ratios["wan_direct_host_growth_over_staging_bound"]
    assert (host["value"], host["status"]) == (pytest.approx(80 / 74), "miss")
    assert ratios["vae_stream_host_growth_over_staging_bound"]["status"] == "pass"
    h2d = ratios["pinned_h2d_throughput_over_best_warm_limit"]
    assert (h2d["value"], h2d["status"]) == (pytest.approx(2.0), "info")
    dit = ratios["dit_direct_over_best_peer_warm"]
    assert (dit["status"], dit["reason"]) == ("skipped", "dit_direct: not measured in this run")
    lines = verdicts(ratios)
    assert "target wan_direct_over_best_peer_warm: met (0.5000 <= 0.8)" in lines
    assert "target wan_direct_over_file_to_gpu_limit_cold: missed (1.5000 <= 1.1)" in lines
    assert (
        "target dit_direct_over_best_peer_warm: not measured (dit_direct: not measured in this run)"
        in lines
    )
    assert not any("pinned_h2d" in line for line in lines)  # info: no target


def test_the_staging_bound_is_the_staging_readers() -> None:
    options = ReadOptions(staging_bytes=1 << 20, staging_buffers=3)
    assert gpu_ratios.staging_bound(options) == options.staging_bound
    assert gpu_ratios.staging_bound() == ReadOptions().staging_bound


# --- the limits' reads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cores", "ladder"),
    [(1, (1, 2)), (2, (1, 2, 4)), (3, (1, 2, 4, 6)), (16, (1, 2, 4, 8, 16, 32))],
)
def test_the_thread_ladder_runs_from_one_to_twice_the_cores(
    cores: int, ladder: tuple[int, ...]
) -> None:
    assert gpu_limits.thread_ladder(cores) == ladder


def test_pieces_cover_every_file_once_from_aligned_starts() -> None:
    sizes = [3 * gpu_limits.ALIGN + 5, 0, 7]
    shares = gpu_limits.pieces(sizes, 2)
    assert len(shares) == 2
    covered: dict[int, list[tuple[int, int]]] = {}
    for share in shares:
        for piece in share:
            assert piece.start % gpu_limits.ALIGN == 0
            assert piece.dest == sum(sizes[: piece.file]) + piece.start
            covered.setdefault(piece.file, []).append((piece.start, piece.end))
    assert sorted(covered[0]) == [(0, 2 * gpu_limits.ALIGN), (2 * gpu_limits.ALIGN, sizes[0])]
    assert 1 not in covered
    assert covered[2] == [(0, 7)]


@pytest.mark.parametrize("direct_io", [False, True])
def test_staged_reads_the_files_back_to_back_through_small_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_io: bool
) -> None:
    monkeypatch.setattr(gpu_limits, "CHUNK", 2 * gpu_limits.ALIGN)  # many chunks per share
    data = [os.urandom(5 * gpu_limits.ALIGN + 123), os.urandom(1000)]
    files = []
    for index, blob in enumerate(data):
        files.append(tmp_path / f"{index}.safetensors")
        files[-1].write_bytes(blob)
    if direct_io and (reason := gpu_limits.direct_io_refused(files[0])) is not None:
        pytest.skip(reason)
    for threads in (1, 3):
        stages = gpu_limits.Stages.make(threads, CPU)
        assert all(b.data_ptr() % gpu_limits.ALIGN == 0 for bs in stages.buffers for b in bs)
        got = gpu_limits.staged(files, stages, CPU, direct_io=direct_io)
        assert got.numpy().tobytes() == b"".join(data)
    host = gpu_limits.read_pinned(files, CPU)
    assert gpu_limits.host_to_device(host, CPU).numpy().tobytes() == b"".join(data)


def test_a_file_that_shrinks_while_staged_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "a.safetensors"
    path.write_bytes(b"x" * 100)
    stages = gpu_limits.Stages.make(1, CPU)
    with pytest.MonkeyPatch.context() as patch:  # the size the reader was told: 200 bytes
        patch.setattr(Path, "stat", lambda self: os.stat_result((0,) * 6 + (200, 0, 0, 0)))
        with pytest.raises(RuntimeError, match="ended at byte 100 of 200"):
            gpu_limits.staged([path], stages, CPU)


def test_o_direct_refused_by_the_file_system_is_said(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm here")
    path = shm / f"bench-gpu-{os.getpid()}"
    path.write_bytes(b"x" * 4096)
    try:
        reason = gpu_limits.direct_io_refused(path)
    finally:
        path.unlink()
    if reason is None:
        pytest.skip("/dev/shm takes O_DIRECT here")
    assert "refuses O_DIRECT" in reason


def test_the_o_direct_rows_are_skipped_where_the_file_system_refuses(
    folder: tuple[Path, dict[str, Any]], mocker: MockerFixture
) -> None:
    where, facts = folder
    _runnable("staged_direct_1", facts)
    mocker.patch.object(gpu_limits, "direct_io_refused", return_value="no O_DIRECT on tmpfs")
    job = gpu_rows.GpuJob(row="staged_direct_1", folder=where, device="cpu", cache="cold")
    assert gpu_rows.run_row(job)["skipped"] == "no O_DIRECT on tmpfs"


# --- the peers' glue, against stand-ins of their documented calls -------------------------------


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def test_the_peer_rows_call_fastsafetensors_and_instanttensor_as_documented(
    folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    where, _ = folder
    (dit,) = gpu_rows.files_of(where, "dit")
    calls: list[str] = []

    class Buffer:
        def __init__(self, names: list[str]) -> None:
            self.state = {k: v for f in names for k, v in load_file(f).items()}

        def get_tensor(self, name: str) -> torch.Tensor:
            return self.state[name]

        def close(self) -> None:
            calls.append("buffer closed")

    class SafeTensorsFileLoader:
        def __init__(self, group: object, device: torch.device, *, nogds: bool) -> None:
            assert nogds
            self.files: list[str] = []

        def add_filenames(self, files: dict[int, list[str]]) -> None:
            self.files = files[0]

        def copy_files_to_device(self) -> Buffer:
            self.buffer = Buffer(self.files)
            return self.buffer

        def get_keys(self) -> list[str]:
            return list(self.buffer.state)

        def close(self) -> None:
            calls.append("loader closed")

    class Opened:
        def __init__(self, path: str) -> None:
            self.state = load_file(path)

        def __enter__(self) -> Opened:
            return self

        def __exit__(self, *_: object) -> None:
            calls.append("instanttensor closed")

        def tensors(self) -> list[tuple[str, torch.Tensor]]:
            return list(self.state.items())

    fst = _module(
        "fastsafetensors", SafeTensorsFileLoader=SafeTensorsFileLoader, SingleGroup=object
    )
    monkeypatch.setitem(sys.modules, "fastsafetensors", fst)
    landed = gpu_rows.fastsafetensors_peer("dit")(where, CPU, None)
    assert sum(t.nbytes for t in landed.tensors) == sum(t.nbytes for t in load_file(dit).values())
    landed.close()
    assert calls == ["buffer closed", "loader closed"]
    it = _module("instanttensor", safe_open=lambda path, framework, device: Opened(path))
    monkeypatch.setitem(sys.modules, "instanttensor", it)
    landed = gpu_rows.instanttensor_peer("dit")(where, CPU, None)
    assert len(landed.tensors) == len(load_file(dit))
    assert calls[-1] == "instanttensor closed"
    row = gpu_rows.GPU_ROWS["dit_instanttensor"]
    assert gpu_rows.unavailable(row, CPU) == "instanttensor loads onto CUDA devices only"


def test_a_missing_peer_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    reason = gpu_rows.unavailable(gpu_rows.GPU_ROWS["wan_fastsafetensors"], CPU)
    assert reason is not None
    assert reason.startswith("fastsafetensors is not installed")
    assert "[peers]" in reason or ".[peers]" in reason


def test_from_pretrained_falls_back_to_to_where_device_map_is_refused(
    folder: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    where, facts = folder
    _runnable("wan_from_pretrained", facts)
    import diffusers

    real = diffusers.WanTransformer3DModel.from_pretrained

    def refusing(*args: Any, **kwargs: Any) -> Any:
        if "device_map" in kwargs:
            raise ValueError("device_map is not supported")
        return real(*args, **kwargs)

    monkeypatch.setattr(diffusers.WanTransformer3DModel, "from_pretrained", refusing)
    assert gpu_rows.wan_from_pretrained(where, CPU, None).note == ".to(cpu)"


# --- runs in fresh interpreters -----------------------------------------------------------------


def test_a_spawned_run_reads_a_json_line_per_job_or_says_why(mocker: MockerFixture) -> None:
    first = {"row": "dit_direct", "folder": "/nowhere", "device": "cpu"}
    second = first | {"row": "staged_1"}
    out = 'noise\n{"row": "dit_direct", "load_s": 1}\n{"row": "staged_1", "load_s": 2}\n'
    run = mocker.patch.object(gpu.subprocess, "run")
    run.return_value = subprocess.CompletedProcess([], 0, stdout=out)
    assert gpu.spawned([first, second]) == [
        {"row": "dit_direct", "load_s": 1},
        {"row": "staged_1", "load_s": 2},
    ]
    argv = run.call_args.args[0]
    assert argv[1:3] == ["-m", "reference.programs.bench.gpu_rows"]
    assert [json.loads(arg) for arg in argv[3:]] == [first, second]
    out = '{"row": "dit_direct", "load_s": 1}\n'
    run.return_value = subprocess.CompletedProcess([], -9, stdout=out, stderr="Killed")
    died = gpu.spawned([first, second])
    assert died[0] == {"row": "dit_direct", "load_s": 1}
    assert died[1] == {"row": "staged_1", "error": "the run exited -9:\nKilled"}
    run.side_effect = subprocess.TimeoutExpired(argv, gpu.RUN_TIMEOUT_S, output=out.encode())
    late = gpu.spawned([first, second])
    assert "load_s" in late[0]
    assert "took over" in late[1]["error"]


def test_the_child_prints_a_json_line_per_job_and_an_error_as_json(
    folder: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    where, _ = folder
    good = {"row": "dit_direct", "folder": str(where), "device": "cpu"}
    bad = good | {"folder": str(where / "missing")}
    assert gpu_rows.main([json.dumps(bad), json.dumps(good)]) == 1
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert "No such file" in lines[0]["error"]
    assert lines[1]["row"] == "dit_direct"
    assert "load_s" in lines[1]
    assert gpu_rows.main([json.dumps(good)]) == 0


@pytest.mark.long  # a fresh interpreter per run: about 20 s on two busy cores
def test_the_table_in_fresh_interpreters_on_the_cpu(folder: tuple[Path, dict[str, Any]]) -> None:
    # Timed runs only: every row once, each in its own interpreter. The sampled runs differ
    # only in what the child measures, which the in-process table above judges on every row;
    # one of them runs here in an interpreter of its own.
    document = gpu.run_gpu_bench(
        size_mib=1,
        reps=1,
        command="bench --gpu (on the cpu)",
        caches=("warm",),
        device="cpu",
        wan=TINY_WAN,
        modes=("time",),
        log=lambda line: None,
    )
    table = document["table"]
    assert table["failed"] == []
    assert "load_s" in table["paths"]["dit_direct"]["warm"]
    text = format_gpu_document(document)
    assert text.endswith("\n".join(verdicts(document["ratios"])))
    where, _ = folder
    job = gpu_rows.GpuJob(row="dit_direct", folder=where, device="cpu", mode="memory", warmup=where)
    (sampled,) = gpu.spawned([gpu_rows.as_request(job)])
    assert "anon_peak" in sampled, sampled


# --- the command ---------------------------------------------------------------------------------


def test_without_cuda_bench_gpu_says_so_in_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    platform = FakePlatform(cuda=False)
    assert bench_command(["--gpu"], platform=platform) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert (
        captured.err == f"bench --gpu: needs CUDA; this machine has none ({describe(platform)})\n"
    )


def test_bench_gpu_takes_its_own_options_only(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--sizes", "1,2"], ["--threads", "2"], ["--reps", "0"]):
        with pytest.raises(SystemExit):
            bench_command(["--gpu", *extra], platform=FakePlatform(cuda=False))
    assert "--gpu takes" in capsys.readouterr().err


def test_bench_gpu_prints_the_table_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls, answer = _answer()
    out = tmp_path / "gpu.json"
    argv = ["--gpu", "--size-mib", "1", "--cache", "warm", "--json", str(out)]
    status = gpu.gpu_command(
        argv,
        size_mib=1,
        reps=None,
        caches=("warm",),
        json_path=out,
        platform=FakePlatform(),
        runner=answer,
        wan=TINY_WAN,
    )
    assert status == 0
    document = json.loads(out.read_text())
    assert document["schema"] == gpu.SCHEMA
    assert document["repetitions"] == gpu.GPU_REPS
    assert {j["cache"] for jobs in calls for j in jobs} == {"warm"}
    printed = capsys.readouterr().out
    assert printed.startswith("$ python -m reference bench --gpu --size-mib 1")
    assert printed.rstrip("\n").endswith("\n".join(verdicts(document["ratios"])))
    _, failing = _answer(errors=frozenset({"dit_direct"}))
    kept = {"size_mib": 1, "reps": 1, "caches": ("warm",), "json_path": None}
    assert gpu.gpu_command([], platform=FakePlatform(), runner=failing, wan=TINY_WAN, **kept) == 1


# --- the summary of .ci/gpu-check.sh -------------------------------------------------------------


def _steps(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "steps.tsv"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_dry_summary_has_every_target_not_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    steps = _steps(tmp_path, "packages\tpassed\t1\t", "gpu-tier\tskipped\t0\tdry run: needs CUDA")
    out = tmp_path / "summary.json"
    argv = ["--steps", str(steps), "--out", str(out), "--bench", str(tmp_path / "none.json")]
    assert gpu_check.main([*argv, "--dry"]) == 0
    summary = json.loads(out.read_text())
    assert summary["dry"] is True
    assert summary["bench_json"] is None
    assert {t["status"] for t in summary["targets"].values()} == {"skipped"}
    assert set(summary["targets"]) == TARGETS
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "step packages: passed (1 s)"
    assert lines[-len(TARGETS) :] == [
        f"target {name}: not measured (dry run: no CUDA step ran)" for name in summary["targets"]
    ]


def test_a_summary_takes_the_benchs_verdicts_and_fails_with_a_failed_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = tmp_path / "bench.json"
    met = {"value": 0.5, "target": 0.8, "op": "<=", "pass": True, "status": "pass"}
    bench.write_text(json.dumps({"ratios": {"wan_direct_over_best_peer_warm": met}}))
    steps = _steps(tmp_path, "unit-cuda\tfailed\t12\texit 1")
    out = tmp_path / "summary.json"
    assert gpu_check.main(["--steps", str(steps), "--out", str(out), "--bench", str(bench)]) == 1
    printed = capsys.readouterr().out
    assert "target wan_direct_over_best_peer_warm: met (0.5000 <= 0.8)" in printed
    assert "target wan_direct_over_best_peer_cold: not measured (the GPU bench did not" in printed
    with pytest.raises(ValueError, match="name, status, seconds, detail"):
        gpu_check.read_steps(_steps(tmp_path, "bench\tgreat\t1\t"))
