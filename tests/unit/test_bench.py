"""The benchmark's own machinery: the copy path it measures, its paths, ratios, JSON and tables.

Timings are never asserted here; only shapes, fates of bytes, and the arithmetic of the ratios.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from reference.__main__ import main
from reference.adopt import ADOPTION_DISABLED, load_full_state
from reference.bench import paths as bench_paths
from reference.bench import runner as bench_runner
from reference.bench.command import parse_sizes, write_folder
from reference.bench.ratios import RATIOS, compute_ratios
from reference.bench.report import format_document, plot_available, write_plot
from reference.checkpoint import TensorReader, open_checkpoint
from reference.dit import load_dit
from reference.kit.fakes.bench import BenchDiT, BenchShapes
from reference.kit.fakes.checkpoints import write_checkpoint
from reference.kit.fakes.layers import LINEAR_KINDS
from reference.plan import WeightLoadPlan

pytestmark = pytest.mark.internal

CPU = torch.device("cpu")
OFFLOAD = WeightLoadPlan(checkpoint_load_device=CPU)
ISSUE_RATIOS = {
    "diffusers_zero_copy_anon_over_checkpoint",
    "diffusers_time_over_from_pretrained",
    "zero_copy_anon_over_checkpoint",
    "zero_copy_time_over_copy_time",
    "copy_throughput_over_readinto",
    "vae_stream_overhead_over_largest_tensor",
    "direct_dit_peak_device_over_model",
    "h2d_throughput_over_pinned_copy",
}


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
    module, report = load_dit(shapes.dit, path, plan=OFFLOAD, kinds=LINEAR_KINDS, adopt=False)
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
    if not spec.cuda and bench_paths.library_missing(spec.library) is None
]


@pytest.mark.parametrize("mode", bench_paths.MODES)
@pytest.mark.parametrize("path", CPU_PATHS)
def test_each_cpu_path_reports_its_figures(
    folder: tuple[Path, dict[str, Any]], path: str, mode: str
) -> None:
    where, facts = folder
    result = bench_paths.run(bench_paths.Job(path, where, mode))
    spec = bench_paths.PATHS[path]
    moved = result["adopted"] + result["copied"] + result["streamed"]
    assert moved >= facts[spec.model]["bytes"]
    keys = {"anon_peak", "file_peak_read"} if mode == "memory" else {"load_s", "load_read_s"}
    assert keys <= set(result)
    assert all(math.isfinite(v) for v in result.values() if isinstance(v, (int, float)))


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


# --- ratios, tables, the command ----------------------------------------------------------------


def _size(**paths: dict[str, float]) -> dict[str, Any]:
    facts = {"bytes": 1000, "largest_tensor_bytes": 100, "tensors": 10, "file_bytes": 1008}
    base = {name: {"skipped": "no CUDA device"} for name in bench_paths.PATHS}
    return {"size_mib": 1, "dit": facts, "vae": facts, "paths": base | paths}


def test_ratios_read_their_figures_and_judge_their_targets() -> None:
    size = _size(
        dit_zero_copy={"anon_peak": 10, "load_s": 0.1, "bytes": 1000},
        dit_copy={"load_s": 1.0, "bytes": 1000},
        readinto={"load_s": 0.5, "bytes": 1000},
        vae_stream={"anon_peak": 1100, "host_anon_bytes": 1000},
        vae_ordinary={"anon_peak": 2000, "host_anon_bytes": 1000},
    )
    ratios = compute_ratios(size)
    assert set(ratios) == {r.name for r in RATIOS}
    assert ratios["zero_copy_anon_over_checkpoint"] == {
        "value": 0.01,
        "target": 0.02,
        "op": "<=",
        "pass": True,
        "status": "pass",
    }
    assert ratios["zero_copy_time_over_copy_time"]["status"] == "miss"  # 0.1 > 0.05
    assert ratios["copy_throughput_over_readinto"]["value"] == pytest.approx(0.5)
    assert ratios["vae_stream_overhead_over_largest_tensor"]["value"] == pytest.approx(1.0)
    assert ratios["vae_ordinary_overhead_over_largest_tensor"]["status"] == "info"
    skipped = ratios["h2d_throughput_over_pinned_copy"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "dit_direct: no CUDA device"


def test_cuda_ratios_with_their_model_dependent_target() -> None:
    size = _size(
        dit_direct={"device_peak": 1050, "load_s": 1.0, "bytes": 1000},
        pinned_h2d={"load_s": 0.5, "bytes": 1000},
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
        assert set(size["paths"]) == set(bench_paths.PATHS)
        for name in CPU_PATHS:
            figures = size["paths"][name]
            for key in ("load_s", "load_read_s", "anon_peak", "file_peak", "throughput"):
                assert math.isfinite(figures[key]), (name, key)
    assert format_document(document) in printed


def test_several_sizes_add_a_growth_table() -> None:
    small = _size(readinto={"anon_peak": 1024**2, "load_s": 0.5, "bytes": 1000})
    large = _size(readinto={"anon_peak": 4 * 1024**2, "load_s": 2.0, "bytes": 4000}) | {
        "size_mib": 4
    }
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
    assert "readinto          anon MiB         1.000        4.000" in growth


def test_plot_without_matplotlib_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if plot_available():
        pytest.skip("matplotlib is installed")
    assert main(["bench", "--plot", str(tmp_path / "p.png")]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    document = {"command": "bench", "sizes": [_size(readinto={"anon_peak": 5, "load_s": 1})]}
    write_plot(document, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
