"""The benchmark's tables (one per size, growth across sizes, ratios) and its optional plot.

A table has a row per (path, cache): the page-cache state the runs started from, warm or cold.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMNS",
    "DEVICE_COLUMN",
    "GROWTH",
    "MIB",
    "NAME_WIDTH",
    "PLOTS",
    "format_document",
    "format_growth",
    "format_pressure",
    "format_ratios",
    "format_size",
    "plot_available",
    "rows",
    "write_plot",
]

MIB = 1024 * 1024
NAME_WIDTH = 22
COLUMNS = (
    # header, figure, scale, format
    ("cached", "cached", 1.0, "{:6.2f}"),
    ("load s", "load_s", 1.0, "{:8.3f}"),
    ("resident s", "resident_s", 1.0, "{:10.3f}"),
    ("cpu s", "load_cpu_s", 1.0, "{:7.3f}"),
    ("build s", "build_s", 1.0, "{:7.3f}"),
    ("read s", "read_s", 1.0, "{:7.3f}"),
    ("place s", "place_s", 1.0, "{:7.3f}"),
    ("GiB/s", "throughput", 1024.0**3, "{:7.2f}"),
    ("anon MiB", "anon_peak", MIB, "{:9.1f}"),
    ("file MiB", "file_peak", MIB, "{:9.1f}"),
    ("file+read", "file_peak_read", MIB, "{:9.1f}"),
    ("adopted", "adopted", MIB, "{:8.1f}"),
    ("copied", "copied", MIB, "{:8.1f}"),
    ("streamed", "streamed", MIB, "{:8.1f}"),
)
DEVICE_COLUMN = ("device MiB", "device_peak", MIB, "{:10.1f}")
# label, figure, scale, plot title
GROWTH = (
    ("load s", "load_s", 1.0, "load time"),
    ("anon MiB", "anon_peak", MIB, "peak anonymous memory growth"),
)
# The plot's panels: figure, cache, scale, axis label, title. Anonymous memory does not depend on
# the page cache, so it is drawn once, warm.
PLOTS = (
    ("load_s", "warm", 1.0, "load s", "load time, warm page cache"),
    ("load_s", "cold", 1.0, "load s", "load time, cold page cache"),
    ("anon_peak", "warm", MIB, "anon MiB", "peak anonymous memory growth"),
)


def _cell(figures: Mapping[str, Any], key: str, scale: float, fmt: str) -> str:
    width = len(fmt.format(0.0))
    if key not in figures:
        return "-".rjust(width)
    return fmt.format(figures[key] / scale)


def _model(facts: Mapping[str, Any], name: str) -> str:
    return (
        f"{name} {facts['bytes'] / MIB:.1f} MiB ({facts['tensors']} tensors,"
        f" largest {facts['largest_tensor_bytes'] / MIB:.1f} MiB)"
    )


def rows(paths: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(path, cache, figures) of every measured pair, and of each skipped one (its figures hold
    `skipped`; a path skipped as a whole has cache "")."""
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    for name, row in paths.items():
        if "skipped" in row:
            out.append((name, "", row))
            continue
        out += [(name, cache, row[cache]) for cache in ("warm", "cold") if cache in row]
    return out


def format_size(size: Mapping[str, Any], reps: int) -> str:
    """The table of one checkpoint size: a row per (path, cache), then the skipped ones."""
    paths: Mapping[str, Mapping[str, Any]] = size["paths"]
    columns = list(COLUMNS)
    if any("device_peak" in figures for _, _, figures in rows(paths)):
        columns.append(DEVICE_COLUMN)
    models = [_model(size["dit"], "DiT"), _model(size["vae"], "VAE")]
    if "ddit" in size:
        models.append(_model(size["ddit"], "diffusers Wan DiT"))
    if "te" in size:
        models.append(_model(size["te"], "UMT5 text encoder"))
    header = [
        f"{'path':<{NAME_WIDTH}}",
        "cache",
        *(h.rjust(len(f.format(0.0))) for h, _, _, f in columns),
    ]
    lines = [f"## {size['size_mib']} MiB: {', '.join(models)}; medians of {reps}", " ".join(header)]
    skipped = []
    for name, cache, figures in rows(paths):
        if "skipped" in figures:
            skipped.append(f"{name}{' ' + cache if cache else ''}: skipped, {figures['skipped']}")
            continue
        cells = [_cell(figures, key, scale, fmt) for _, key, scale, fmt in columns]
        lines.append(" ".join([f"{name:<{NAME_WIDTH}}", f"{cache:<5}", *cells]))
    best = paths.get("best_read", {})
    chosen = [
        f"{cache} {best[cache]['of']} ({best[cache]['throughput'] / 1024.0**3:.2f} GiB/s)"
        for cache in ("warm", "cold")
        if cache in best
    ]
    if chosen:
        lines.append("best_read: " + ", ".join(chosen))
    return "\n".join(lines + skipped)


def _ratio_width(names: Iterable[str]) -> int:
    return max([43, *(len(name) for name in names)])


def format_ratios(ratios: Mapping[str, Mapping[str, Any]]) -> str:
    width = _ratio_width(ratios)
    lines = [f"{'ratio':<{width}} {'value':>9}  {'target':<10} verdict"]
    for name, r in ratios.items():
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        target = f"{r['op']} {r['target']:.4g}" if r["target"] is not None else ""
        verdict = r["status"] + (f": {r['reason']}" if "reason" in r else "")
        lines.append(f"{name:<{width}} {value:>9}  {target:<10} {verdict}")
    return "\n".join(lines)


def format_growth(sizes: list[Mapping[str, Any]]) -> str:
    """How each path's time and peak anonymous memory grow with checkpoint size."""
    header = " ".join(f"{s['size_mib']:>8} MiB" for s in sizes)
    lines = [
        "## growth with checkpoint size",
        f"{'path':<{NAME_WIDTH}} cache {'figure':<9} {header}",
    ]
    for name, cache, _ in rows(sizes[0]["paths"]):
        if not cache:
            continue
        for label, key, scale, _ in GROWTH:
            cells = [_cell(s["paths"][name].get(cache, {}), key, scale, "{:12.3f}") for s in sizes]
            lines.append(f"{name:<{NAME_WIDTH}} {cache:<5} {label:<9} {' '.join(cells)}")
    width = _ratio_width(sizes[0]["ratios"])
    lines.append(f"{'ratio':<{width}} {header}")
    for ratio in sizes[0]["ratios"]:
        values = [s["ratios"][ratio]["value"] for s in sizes]
        shown = " ".join("-".rjust(12) if v is None else f"{v:12.4f}" for v in values)
        lines.append(f"{ratio:<{width}} {shown}")
    return "\n".join(lines)


def format_pressure(machine: Mapping[str, Any]) -> str:
    """The memory-pressure stalls during the run (/proc/vmstat deltas), or "" where unknown."""
    before, after = machine.get("pressure_before") or {}, machine.get("pressure_after") or {}
    deltas = {name: after[name] - before[name] for name in before if name in after}
    if not deltas:
        return ""
    listed = ", ".join(f"{name} {delta}" for name, delta in deltas.items())
    return f"; memory pressure during the run (/proc/vmstat): {listed}"


def format_document(document: Mapping[str, Any]) -> str:
    """Everything the command prints: machine, a table per size, growth, ratios."""
    reps = document["repetitions"]
    machine = document["machine"]
    parts = [
        f"$ {document['command']}",
        f"machine: {machine['platform']}; {machine['cpus']} CPUs, {machine['torch_threads']} torch"
        " threads",
    ]
    parts += [format_size(size, reps) for size in document["sizes"]]
    parts.append(
        f"load average (1 min) {machine['load_average'][0]:.2f} before,"
        f" {machine['load_average_after'][0]:.2f} after" + format_pressure(machine)
    )
    paths = document["sizes"][0]["paths"]
    parts.append(
        "\n".join(f"{name:<{NAME_WIDTH}} {f.get('about', '')}" for name, f in paths.items())
    )
    if len(document["sizes"]) > 1:
        parts.append(format_growth(document["sizes"]))
    parts.append(format_ratios(document["ratios"]))
    return "\n\n".join(parts)


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(document: Mapping[str, Any], path: Path) -> None:  # pragma: no cover - optional
    """One PNG: load time (warm, cold) and peak anonymous memory against checkpoint size, a line
    per path (of the read limits only `best_read`, the fastest)."""
    # Imported by name: matplotlib is an optional extra, absent from the type check.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    sizes = document["sizes"]
    figure, axes = plt.subplots(1, len(PLOTS), figsize=(18, 5.5))
    for name, row in sizes[0]["paths"].items():
        if row.get("limit"):
            continue
        for axis, (key, cache, scale, label, title) in zip(axes, PLOTS, strict=True):
            measured = [s for s in sizes if key in s["paths"][name].get(cache, {})]
            if not measured:
                continue
            x = [s["size_mib"] for s in measured]
            y = [max(s["paths"][name][cache][key] / scale, 1e-3) for s in measured]
            axis.plot(x, y, marker="o", label=name)
            axis.set_ylabel(label)
            axis.set_title(title)
    for axis in axes:
        axis.set_xlabel("checkpoint MiB")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=7)
    figure.suptitle(document["command"], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
