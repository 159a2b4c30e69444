"""The benchmark's ratios: the figures its performance claims rest on, with their targets.

Each ratio is read off one size's medians (`reference.programs.bench.command.measure_size`), each
figure of one (path, cache) pair: a cache state is "warm" or "cold", and `best_read` is the fastest
read limit of that state. A ratio whose (path, cache) was skipped (no CUDA, pages that could not be
dropped) or not measured (`--cache`) is reported as skipped, with the reason; a ratio without a
target is shown for comparison ("info").
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["RATIOS", "Judged", "Ratio", "compute_ratios", "judge", "missing"]

Figures = Mapping[str, Any]


@dataclass(frozen=True)
class Ratio:
    """A named ratio, its target, and how it is read off the figures.

    `needs` names the (path, cache) pairs it reads.
    """

    name: str
    op: str  # "<=", ">=", or "" for a figure shown without a target
    target: Callable[[Figures], float] | None
    value: Callable[[Figures], float]
    needs: tuple[tuple[str, str], ...]


def _fig(size: Figures, path: str, cache: str, key: str) -> float:
    return float(size["paths"][path][cache][key])


def _time_over(name: str, target: float, path: str, other: str, cache: str = "warm") -> Ratio:
    """`name`: `path`'s load time over `other`'s, both in `cache`, at most `target`."""
    return Ratio(
        name,
        "<=",
        lambda s: target,
        lambda s: _fig(s, path, cache, "load_s") / _fig(s, other, cache, "load_s"),
        ((path, cache), (other, cache)),
    )


def _rate(size: Figures, path: str, cache: str) -> float:
    return float(size["paths"][path]["bytes"]) / _fig(size, path, cache, "load_s")


def _over_best_read(size: Figures, *, path: str, cache: str) -> float:
    return _rate(size, path, cache) / _rate(size, "best_read", cache)


def _overhead(size: Figures, path: str) -> float:
    extra = _fig(size, path, "warm", "anon_peak") - _fig(size, path, "warm", "host_anon_bytes")
    return extra / float(size["vae"]["largest_tensor_bytes"])


def _resident_over_read(size: Figures, path: str, cache: str) -> float:
    """The path's time until every byte is resident over the best read of as many bytes."""
    best_time = float(size["paths"][path]["bytes"]) / _rate(size, "best_read", cache)
    return _fig(size, path, cache, "resident_s") / best_time


PIPE_ALONE = ("pipe_copy_transformer", "pipe_copy_text_encoder", "pipe_copy_vae")
"""The bench pipeline's components, each loaded alone on the copy path."""


def _pipeline_over_bound(size: Figures, *, cache: str) -> float:
    """The whole pipeline's load over what it cannot beat: its slowest component loaded alone,
    or all its bytes read at the machine's best read rate (PIPE-4's target)."""
    slowest = max(_fig(size, path, cache, "load_s") for path in PIPE_ALONE)
    at_the_limit = float(size["pipe"]["bytes"]) / _rate(size, "best_read", cache)
    return _fig(size, "pipe_copy", cache, "load_s") / max(slowest, at_the_limit)


RATIOS = (
    Ratio(
        "zero_copy_anon_over_checkpoint",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "dit_zero_copy", "warm", "anon_peak") / s["dit"]["bytes"],
        (("dit_zero_copy", "warm"),),
    ),
    _time_over("zero_copy_time_over_copy_time", 0.05, "dit_zero_copy", "dit_copy_pool"),
    Ratio(
        "cold_copy_throughput_over_best_cold_read",
        ">=",
        lambda s: 0.9,
        lambda s: _rate(s, "dit_copy_pool", "cold") / _rate(s, "best_read", "cold"),
        (("dit_copy_pool", "cold"), ("best_read", "cold")),
    ),
    Ratio(
        "warm_copy_throughput_over_best_warm_read",
        ">=",
        lambda s: 0.9,
        lambda s: _rate(s, "dit_copy_pool", "warm") / _rate(s, "best_read", "warm"),
        (("dit_copy_pool", "warm"), ("best_read", "warm")),
    ),
    *(
        Ratio(
            f"{cache}_direct_cpu_throughput_over_best_{cache}_read",
            ">=",
            lambda s: 0.9,
            functools.partial(_over_best_read, path="dit_direct_cpu", cache=cache),
            (("dit_direct_cpu", cache), ("best_read", cache)),
        )
        for cache in ("cold", "warm")
    ),
    Ratio(
        "cold_map_copy_throughput_over_best_cold_read",
        "",
        None,
        lambda s: _rate(s, "dit_copy", "cold") / _rate(s, "best_read", "cold"),
        (("dit_copy", "cold"), ("best_read", "cold")),
    ),
    Ratio(
        "warm_map_copy_throughput_over_best_warm_read",
        "",
        None,
        lambda s: _rate(s, "dit_copy", "warm") / _rate(s, "best_read", "warm"),
        (("dit_copy", "warm"), ("best_read", "warm")),
    ),
    Ratio(
        "copy_throughput_over_readinto",
        "",
        None,
        lambda s: _rate(s, "dit_copy_pool", "warm") / _rate(s, "readinto", "warm"),
        (("dit_copy_pool", "warm"), ("readinto", "warm")),
    ),
    Ratio(
        "cold_zero_copy_resident_over_best_cold_read_time",
        "<=",
        lambda s: 1.1,
        lambda s: _resident_over_read(s, "dit_zero_copy_prefetch", "cold"),
        (("dit_zero_copy_prefetch", "cold"), ("best_read", "cold")),
    ),
    Ratio(
        "cold_no_prefetch_resident_over_best_cold_read_time",
        "",
        None,
        lambda s: _resident_over_read(s, "dit_zero_copy", "cold"),
        (("dit_zero_copy", "cold"), ("best_read", "cold")),
    ),
    Ratio(
        "vae_stream_overhead_over_largest_tensor",
        "<=",
        lambda s: 1.5,
        lambda s: _overhead(s, "vae_stream"),
        (("vae_stream", "warm"),),
    ),
    Ratio(
        "vae_pool_overhead_over_largest_tensor",
        "<=",
        lambda s: s["vae_tensors_in_flight"] + 0.5,
        lambda s: _overhead(s, "vae_stream_pool"),
        (("vae_stream_pool", "warm"),),
    ),
    Ratio(
        "vae_ordinary_overhead_over_largest_tensor",
        "",
        None,
        lambda s: _overhead(s, "vae_ordinary"),
        (("vae_ordinary", "warm"),),
    ),
    Ratio(
        "copy_path_refused_above_available_memory",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "dit_copy_refused", "warm", "anon_peak") / s["dit"]["bytes"],
        (("dit_copy_refused", "warm"),),
    ),
    Ratio(
        "diffusers_zero_copy_anon_over_checkpoint",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "ddit_zero_copy", "warm", "anon_peak") / s["ddit"]["bytes"],
        (("ddit_zero_copy", "warm"),),
    ),
    _time_over(
        "diffusers_offload_time_over_from_pretrained", 0.8, "ddit_zero_copy", "ddit_pretrained"
    ),
    Ratio(
        "te_zero_copy_anon_over_checkpoint",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "te_zero_copy", "warm", "anon_peak") / s["te"]["bytes"],
        (("te_zero_copy", "warm"),),
    ),
    _time_over("te_offload_time_over_from_pretrained", 0.5, "te_zero_copy", "te_pretrained"),
    _time_over(
        "cold_te_offload_time_over_cold_from_pretrained",
        1.0,
        "te_zero_copy",
        "te_pretrained",
        cache="cold",
    ),
    Ratio(
        "te_adopted_over_checkpoint",
        ">=",
        lambda s: 0.99,
        lambda s: _fig(s, "te_zero_copy", "warm", "adopted") / s["te"]["bytes"],
        (("te_zero_copy", "warm"),),
    ),
    Ratio(
        "te_from_pretrained_anon_over_checkpoint",
        "",
        None,
        lambda s: _fig(s, "te_pretrained", "warm", "anon_peak") / s["te"]["bytes"],
        (("te_pretrained", "warm"),),
    ),
    _time_over("guarded_meta_build_over_unguarded", 1.1, "wan14b_guarded", "wan14b_unguarded"),
    *(
        Ratio(
            f"{prefix}pipeline_over_slowest_alone_or_read_limit",
            "<=",
            lambda s: 1.1,
            functools.partial(_pipeline_over_bound, cache=cache),
            tuple((path, cache) for path in ("pipe_copy", *PIPE_ALONE, "best_read")),
        )
        for prefix, cache in (("", "warm"), ("cold_", "cold"))
    ),
    _time_over("pipeline_over_sequential", 0.75, "pipe_copy", "pipe_copy_sequential"),
    _time_over(
        "pipeline_offload_over_diffusers_from_pretrained", 0.5, "pipe_offload", "pipe_pretrained"
    ),
    Ratio(
        "pipeline_anon_peak_over_sequential",
        "<=",
        lambda s: 1.05,
        lambda s: (
            _fig(s, "pipe_copy", "warm", "anon_peak")
            / _fig(s, "pipe_copy_sequential", "warm", "anon_peak")
        ),
        (("pipe_copy", "warm"), ("pipe_copy_sequential", "warm")),
    ),
    Ratio(
        "from_pretrained_anon_over_checkpoint",
        "",
        None,
        lambda s: _fig(s, "ddit_pretrained", "warm", "anon_peak") / s["ddit"]["bytes"],
        (("ddit_pretrained", "warm"),),
    ),
    Ratio(
        "direct_dit_peak_device_over_model",
        "<=",
        lambda s: 1.0 + s["dit"]["largest_tensor_bytes"] / s["dit"]["bytes"],
        lambda s: _fig(s, "dit_direct", "warm", "device_peak") / s["dit"]["bytes"],
        (("dit_direct", "warm"),),
    ),
    Ratio(
        "h2d_throughput_over_pinned_copy",
        ">=",
        lambda s: 0.7,
        lambda s: _rate(s, "dit_direct", "warm") / _rate(s, "pinned_h2d", "warm"),
        (("dit_direct", "warm"), ("pinned_h2d", "warm")),
    ),
)


def missing(size: Figures, path: str, cache: str) -> str | None:
    """Why the figures of (path, cache) are not there, or None."""
    row = size["paths"][path]
    if "skipped" in row:
        return f"{path}: {row['skipped']}"
    if cache not in row:
        return f"{path} {cache}: not measured in this run"
    if "skipped" in row[cache]:
        return f"{path} {cache}: {row[cache]['skipped']}"
    return None


class Judged(Protocol):
    """What `judge` reads of a ratio (`Ratio` here, `GpuRatio` in the GPU table)."""

    @property
    def name(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def target(self) -> Callable[[Figures], float] | None: ...
    @property
    def value(self) -> Callable[[Figures], float]: ...


R = TypeVar("R", bound=Judged)


def judge(
    size: Figures,
    ratios: Sequence[R],
    reason: Callable[[Figures, R], str | None],
) -> dict[str, dict[str, Any]]:
    """Each ratio's value, target and verdict ("pass", "miss", "info", or "skipped" with
    `reason(size, ratio)`, the first figure it needs that is missing)."""
    out: dict[str, dict[str, Any]] = {}
    for ratio in ratios:
        why = reason(size, ratio)
        if why is not None:
            out[ratio.name] = {"value": None, "target": None, "op": ratio.op, "pass": None}
            out[ratio.name] |= {"status": "skipped", "reason": why}
            continue
        value = ratio.value(size)
        target = ratio.target(size) if ratio.target else None
        passed = None
        if target is not None:
            passed = value <= target if ratio.op == "<=" else value >= target
        status = "info" if passed is None else ("pass" if passed else "miss")
        out[ratio.name] = {
            "value": value,
            "target": target,
            "op": ratio.op,
            "pass": passed,
            "status": status,
        }
    return out


def _first_missing(size: Figures, ratio: Ratio) -> str | None:
    reasons = (missing(size, path, cache) for path, cache in ratio.needs)
    return next((r for r in reasons if r is not None), None)


def compute_ratios(size: Figures) -> dict[str, dict[str, Any]]:
    """Each ratio's value, target and verdict ("pass", "miss", "info" or "skipped")."""
    return judge(size, RATIOS, _first_missing)
