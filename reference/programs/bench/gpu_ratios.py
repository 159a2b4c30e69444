"""The GPU table's ratios, with their targets, and the one-line verdict of each target.

Each ratio reads one GPU table (`reference.programs.bench.gpu.measure_table`): its rows' medians
per page-cache state under "paths", the pseudo-rows `best_limit` (the fastest file-to-device
limit of each state, `reference.programs.bench.gpu_limits`) and `best_peer_<model>` (the fastest
peer on that model's files), and the models' facts ("dit", "vae", "wan": bytes, largest tensor).

    <model>_direct_over_file_to_gpu_limit_<cache>  <= 1.1
        the reference's direct load time over the time the best limit takes for as many bytes
    <model>_direct_over_best_peer_<cache>  <= 0.8 warm, <= 1.0 cold
        the reference's direct load time over the fastest peer's on the same files
    <row>_peak_device_over_model  <= 1 + largest tensor / model + 2 MiB / model
        peak device memory (`torch.cuda.max_memory_allocated`) over the model's bytes (DG-5)
    <row>_host_growth_over_staging_bound  <= 1
        peak anonymous host memory growth over the staging bound plus the largest tensor (DG-8)

A ratio whose figures are missing (a row skipped, a cache state not measured, a figure the
device does not give, such as device memory on the CPU) is "skipped" with the reason; a ratio
without a target is "info".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reference.programs.bench.ratios import judge, missing
from reference.read.reading import ReadOptions

__all__ = [
    "DEVICE_SLACK",
    "GPU_RATIOS",
    "MEMORY_CACHE",
    "REFERENCE_ROWS",
    "VERDICTS",
    "GpuRatio",
    "compute_gpu_ratios",
    "staging_bound",
    "verdict",
]

Figures = Mapping[str, Any]
MIB = 1024 * 1024
DEVICE_SLACK = 2 * MIB
"""Device bytes allowed beyond model + largest tensor: the allocator's rounding and small
buffers made at load time."""
MEMORY_CACHE = "warm"
"""The page-cache state whose sampled runs give the memory ratios (memory does not depend on it)."""
VERDICTS = {"pass": "met", "miss": "missed", "skipped": "not measured", "info": "info"}


def staging_bound(options: ReadOptions | None = None) -> int:
    """The staging reader's bound on the host memory a load onto a device holds beside its
    tensors (DG-8): `ReadOptions.staging_bound` of `options`, by default `ReadOptions()` (the
    reference rows load with the loader's default options)."""
    return (ReadOptions() if options is None else options).staging_bound


@dataclass(frozen=True)
class GpuRatio:
    """A named ratio, its target, how it is read, and the (row, cache, figure) triples it needs."""

    name: str
    op: str  # "<=", ">=", or "" for a figure shown without a target
    target: Callable[[Figures], float] | None
    value: Callable[[Figures], float]
    needs: tuple[tuple[str, str, str], ...]


def _fig(size: Figures, row: str, cache: str, key: str) -> float:
    return float(size["paths"][row][cache][key])


def _over_limit(row: str, model: str, cache: str) -> GpuRatio:
    def value(s: Figures) -> float:
        limit_s = s[model]["bytes"] / _fig(s, "best_limit", cache, "throughput")
        return _fig(s, row, cache, "load_s") / float(limit_s)

    return GpuRatio(
        f"{model}_direct_over_file_to_gpu_limit_{cache}",
        "<=",
        lambda s: 1.1,
        value,
        ((row, cache, "load_s"), ("best_limit", cache, "throughput")),
    )


def _over_peer(row: str, model: str, cache: str) -> GpuRatio:
    target = 0.8 if cache == "warm" else 1.0
    peer = f"best_peer_{model}"
    return GpuRatio(
        f"{model}_direct_over_best_peer_{cache}",
        "<=",
        lambda s: target,
        lambda s: _fig(s, row, cache, "load_s") / _fig(s, peer, cache, "load_s"),
        ((row, cache, "load_s"), (peer, cache, "load_s")),
    )


def _peak(row: str, model: str, *, judged: bool = True) -> GpuRatio:
    def target(s: Figures) -> float:
        facts = s[model]
        return 1.0 + float(facts["largest_tensor_bytes"] + DEVICE_SLACK) / float(facts["bytes"])

    return GpuRatio(
        f"{row}_peak_device_over_model",
        "<=" if judged else "",
        target if judged else None,
        lambda s: _fig(s, row, MEMORY_CACHE, "device_peak") / s[model]["bytes"],
        ((row, MEMORY_CACHE, "device_peak"),),
    )


def _host(row: str, model: str) -> GpuRatio:
    def value(s: Figures) -> float:
        bound = float(s["staging_bound"] + s[model]["largest_tensor_bytes"])
        return _fig(s, row, MEMORY_CACHE, "anon_peak") / bound

    return GpuRatio(
        f"{row}_host_growth_over_staging_bound",
        "<=",
        lambda s: 1.0,
        value,
        ((row, MEMORY_CACHE, "anon_peak"),),
    )


REFERENCE_ROWS = (("wan_direct", "wan"), ("dit_direct", "dit"), ("vae_stream", "vae"))
"""The reference's rows and whose files they read."""
GPU_RATIOS = (
    *(
        ratio
        for model in ("wan", "dit")
        for cache in ("warm", "cold")
        for ratio in (
            _over_limit(f"{model}_direct", model, cache),
            _over_peer(f"{model}_direct", model, cache),
        )
    ),
    *(_peak(row, model) for row, model in REFERENCE_ROWS),
    *(_host(row, model) for row, model in REFERENCE_ROWS),
    _peak("wan_from_pretrained", "wan", judged=False),
    _peak("wan_load_file", "wan", judged=False),
    GpuRatio(
        "pinned_h2d_throughput_over_best_warm_limit",
        "",
        None,
        lambda s: (
            _fig(s, "pinned_h2d", "warm", "throughput")
            / _fig(s, "best_limit", "warm", "throughput")
        ),
        (("pinned_h2d", "warm", "throughput"), ("best_limit", "warm", "throughput")),
    ),
)


def _reason(size: Figures, row: str, cache: str, figure: str) -> str | None:
    if row not in size["paths"]:
        return f"{row}: not measured in this run"
    reason = missing(size, row, cache)
    if reason is None and figure not in size["paths"][row][cache]:
        return f"{row} {cache}: no {figure} figure on this device"
    return reason


def _first_missing(size: Figures, ratio: GpuRatio) -> str | None:
    reasons = (_reason(size, *need) for need in ratio.needs)
    return next((r for r in reasons if r is not None), None)


def compute_gpu_ratios(size: Figures) -> dict[str, dict[str, Any]]:
    """Each ratio's value, target and status ("pass", "miss", "info" or "skipped", with the
    reason)."""
    return judge(size, GPU_RATIOS, _first_missing)


def verdict(name: str, ratio: Mapping[str, Any]) -> str:
    """One line per target: "target NAME: met|missed (value op target)" or "target NAME: not
    measured (reason)"."""
    word = VERDICTS[ratio["status"]]
    if ratio["status"] == "skipped":
        return f"target {name}: {word} ({ratio.get('reason', '')})"
    return f"target {name}: {word} ({ratio['value']:.4f} {ratio['op']} {ratio['target']:.4g})"
