"""The benchmark's ratios: the figures its performance claims rest on, with their targets.

Each ratio is read off one size's medians (`reference.bench.command.measure_size`). A ratio
whose paths were skipped (no CUDA) is reported as skipped, with the reason; a ratio without a
target is shown for comparison ("info").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["RATIOS", "Ratio", "compute_ratios"]


@dataclass(frozen=True)
class Ratio:
    """A named ratio, its target, and how it is read off the figures."""

    name: str
    op: str  # "<=", ">=", or "" for a figure shown without a target
    target: Callable[[Mapping[str, Any]], float] | None
    value: Callable[[Mapping[str, Any]], float]
    needs: tuple[str, ...]


def _fig(size: Mapping[str, Any], path: str, key: str) -> float:
    return float(size["paths"][path][key])


def _rate(size: Mapping[str, Any], path: str) -> float:
    return float(size["paths"][path]["bytes"]) / _fig(size, path, "load_s")


def _overhead(size: Mapping[str, Any], path: str) -> float:
    extra = _fig(size, path, "anon_peak") - _fig(size, path, "host_anon_bytes")
    return extra / float(size["vae"]["largest_tensor_bytes"])


RATIOS = (
    Ratio(
        "zero_copy_anon_over_checkpoint",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "dit_zero_copy", "anon_peak") / s["dit"]["bytes"],
        ("dit_zero_copy",),
    ),
    Ratio(
        "zero_copy_time_over_copy_time",
        "<=",
        lambda s: 0.05,
        lambda s: _fig(s, "dit_zero_copy", "load_s") / _fig(s, "dit_copy", "load_s"),
        ("dit_zero_copy", "dit_copy"),
    ),
    Ratio(
        "copy_throughput_over_readinto",
        ">=",
        lambda s: 0.9,
        lambda s: _rate(s, "dit_copy") / _rate(s, "readinto"),
        ("dit_copy", "readinto"),
    ),
    Ratio(
        "vae_stream_overhead_over_largest_tensor",
        "<=",
        lambda s: 1.5,
        lambda s: _overhead(s, "vae_stream"),
        ("vae_stream",),
    ),
    Ratio(
        "vae_ordinary_overhead_over_largest_tensor",
        "",
        None,
        lambda s: _overhead(s, "vae_ordinary"),
        ("vae_ordinary",),
    ),
    Ratio(
        "diffusers_zero_copy_anon_over_checkpoint",
        "<=",
        lambda s: 0.02,
        lambda s: _fig(s, "ddit_zero_copy", "anon_peak") / s["ddit"]["bytes"],
        ("ddit_zero_copy",),
    ),
    Ratio(
        "diffusers_time_over_from_pretrained",
        "",
        None,
        lambda s: _fig(s, "ddit_zero_copy", "load_s") / _fig(s, "ddit_pretrained", "load_s"),
        ("ddit_zero_copy", "ddit_pretrained"),
    ),
    Ratio(
        "from_pretrained_anon_over_checkpoint",
        "",
        None,
        lambda s: _fig(s, "ddit_pretrained", "anon_peak") / s["ddit"]["bytes"],
        ("ddit_pretrained",),
    ),
    Ratio(
        "direct_dit_peak_device_over_model",
        "<=",
        lambda s: 1.0 + s["dit"]["largest_tensor_bytes"] / s["dit"]["bytes"],
        lambda s: _fig(s, "dit_direct", "device_peak") / s["dit"]["bytes"],
        ("dit_direct",),
    ),
    Ratio(
        "h2d_throughput_over_pinned_copy",
        ">=",
        lambda s: 0.7,
        lambda s: _rate(s, "dit_direct") / _rate(s, "pinned_h2d"),
        ("dit_direct", "pinned_h2d"),
    ),
)


def compute_ratios(size: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each ratio's value, target and verdict ("pass", "miss", "info" or "skipped")."""
    out: dict[str, dict[str, Any]] = {}
    for ratio in RATIOS:
        missing = [p for p in ratio.needs if "skipped" in size["paths"][p]]
        if missing:
            reason = size["paths"][missing[0]]["skipped"]
            out[ratio.name] = {"value": None, "target": None, "op": ratio.op, "pass": None}
            out[ratio.name] |= {"status": "skipped", "reason": f"{missing[0]}: {reason}"}
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
