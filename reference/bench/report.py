"""The benchmark's tables (one per size, growth across sizes, ratios) and its optional plot."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMNS",
    "DEVICE_COLUMN",
    "GROWTH",
    "MIB",
    "format_document",
    "format_growth",
    "format_ratios",
    "format_size",
    "plot_available",
    "write_plot",
]

MIB = 1024 * 1024
COLUMNS = (
    # header, figure, scale, format
    ("load s", "load_s", 1.0, "{:8.3f}"),
    ("+read s", "load_read_s", 1.0, "{:8.3f}"),
    ("cpu s", "load_cpu_s", 1.0, "{:7.3f}"),
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


def format_size(size: Mapping[str, Any], reps: int) -> str:
    """The table of one checkpoint size: a row per path, then skipped paths."""
    paths: Mapping[str, Mapping[str, Any]] = size["paths"]
    columns = list(COLUMNS)
    if any("device_peak" in figures for figures in paths.values()):
        columns.append(DEVICE_COLUMN)
    models = [_model(size["dit"], "DiT"), _model(size["vae"], "VAE")]
    if "ddit" in size:
        models.append(_model(size["ddit"], "diffusers Wan DiT"))
    lines = [
        f"## {size['size_mib']} MiB: {', '.join(models)}; medians of {reps}",
        " ".join([f"{'path':<17}", *(h.rjust(len(f.format(0.0))) for h, _, _, f in columns)]),
    ]
    skipped = []
    for name, figures in paths.items():
        if "skipped" in figures:
            skipped.append(f"{name}: skipped, {figures['skipped']}")
            continue
        cells = [_cell(figures, key, scale, fmt) for _, key, scale, fmt in columns]
        lines.append(" ".join([f"{name:<17}", *cells]))
    return "\n".join(lines + skipped)


def format_ratios(ratios: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [f"{'ratio':<43} {'value':>9}  {'target':<10} verdict"]
    for name, r in ratios.items():
        value = "-" if r["value"] is None else f"{r['value']:.4f}"
        target = f"{r['op']} {r['target']:.4g}" if r["target"] is not None else ""
        verdict = r["status"] + (f": {r['reason']}" if "reason" in r else "")
        lines.append(f"{name:<43} {value:>9}  {target:<10} {verdict}")
    return "\n".join(lines)


def format_growth(sizes: list[Mapping[str, Any]]) -> str:
    """How each path's time and peak anonymous memory grow with checkpoint size."""
    header = " ".join(f"{s['size_mib']:>8} MiB" for s in sizes)
    lines = ["## growth with checkpoint size", f"{'path':<17} {'figure':<9} {header}"]
    for name in sizes[0]["paths"]:
        for label, key, scale, _ in GROWTH:
            cells = [_cell(s["paths"][name], key, scale, "{:12.3f}") for s in sizes]
            lines.append(f"{name:<17} {label:<9} {' '.join(cells)}")
    lines.append(f"{'ratio':<43} {header}")
    for ratio in sizes[0]["ratios"]:
        values = [s["ratios"][ratio]["value"] for s in sizes]
        lines.append(
            f"{ratio:<43} " + " ".join("-".rjust(12) if v is None else f"{v:12.4f}" for v in values)
        )
    return "\n".join(lines)


def format_document(document: Mapping[str, Any]) -> str:
    """Everything the command prints: machine, a table per size, growth, ratios."""
    reps = document["repetitions"]
    machine = document["machine"]
    parts = [
        f"$ {document['command']}",
        f"machine: {machine['platform']}; {machine['cpus']} CPUs, {machine['torch_threads']} torch"
        f" threads; load average {machine['load_average'][0]:.2f} before,"
        f" {machine['load_average_after'][0]:.2f} after",
    ]
    parts += [format_size(size, reps) for size in document["sizes"]]
    paths = document["sizes"][0]["paths"]
    parts.append("\n".join(f"{name:<17} {f.get('about', '')}" for name, f in paths.items()))
    if len(document["sizes"]) > 1:
        parts.append(format_growth(document["sizes"]))
    parts.append(format_ratios(document["ratios"]))
    return "\n\n".join(parts)


def plot_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(document: Mapping[str, Any], path: Path) -> None:  # pragma: no cover - optional
    """A PNG of peak anonymous memory and load time against checkpoint size, one line a path."""
    # Imported by name: matplotlib is an optional extra, absent from the type check.
    importlib.import_module("matplotlib").use("Agg")
    plt = importlib.import_module("matplotlib.pyplot")

    sizes = document["sizes"]
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for name in sizes[0]["paths"]:
        measured = [s for s in sizes if "skipped" not in s["paths"][name]]
        if not measured:
            continue
        x = [s["size_mib"] for s in measured]
        for axis, (label, key, scale, title) in zip(axes, GROWTH, strict=True):
            y = [max(s["paths"][name][key] / scale, 1e-3) for s in measured]
            axis.plot(x, y, marker="o", label=name)
            axis.set_ylabel(label)
            axis.set_title(title)
    for axis in axes:
        axis.set_xlabel("checkpoint MiB")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(document["command"], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
