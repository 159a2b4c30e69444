"""The GPU table as text: a row per (row, cache), the best limit and peers, the ratios, and one
verdict line per target (`reference.programs.bench.gpu_ratios.verdict`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reference.programs.bench.gpu_ratios import verdict
from reference.programs.bench.report import format_ratios

__all__ = ["GPU_COLUMNS", "MIB", "ROW_WIDTH", "format_gpu_document", "format_table", "verdicts"]

MIB = 1024 * 1024
ROW_WIDTH = 22
GPU_COLUMNS = (
    # header, figure, scale, format
    ("cached", "cached", 1.0, "{:6.2f}"),
    ("load s", "load_s", 1.0, "{:8.3f}"),
    ("cpu s", "load_cpu_s", 1.0, "{:7.3f}"),
    ("GiB/s", "throughput", 1024.0**3, "{:7.2f}"),
    ("device MiB", "device_peak", MIB, "{:10.1f}"),
    ("anon MiB", "anon_peak", MIB, "{:9.1f}"),
    ("landed MiB", "device_bytes", MIB, "{:10.1f}"),
)
MODELS = (
    ("dit", "the bench's DiT"),
    ("vae", "the bench's VAE"),
    ("wan", "the Wan DiT"),
)


def _cell(figures: Mapping[str, Any], key: str, scale: float, fmt: str) -> str:
    if key not in figures:
        return "-".rjust(len(fmt.format(0.0)))
    return fmt.format(figures[key] / scale)


def _model(facts: Mapping[str, Any], name: str) -> str:
    return (
        f"{name} {facts['bytes'] / MIB:.1f} MiB ({facts['tensors']} tensors,"
        f" largest {facts['largest_tensor_bytes'] / MIB:.1f} MiB)"
    )


def format_table(table: Mapping[str, Any], reps: int) -> str:
    """A row per measured (row, cache), then the best limit and peers, the skipped rows and
    what each row is."""
    models = [_model(table[key], name) for key, name in MODELS if key in table]
    header = " ".join(
        [
            f"{'row':<{ROW_WIDTH}}",
            "cache",
            *(h.rjust(len(f.format(0.0))) for h, _, _, f in GPU_COLUMNS),
        ]
    )
    lines = [
        f"## GPU table on {table['device']}: {', '.join(models)}; medians of {reps}",
        header + "  note",
    ]
    skipped, best, about = [], [], []
    for name, row in table["paths"].items():
        if name.startswith("best_"):
            for cache in ("warm", "cold"):
                if cache in row:
                    figures = row[cache]
                    best.append(
                        f"{name} {cache}: {figures['of']} ({figures['load_s']:.3f} s,"
                        f" {figures.get('throughput', 0.0) / 1024.0**3:.2f} GiB/s)"
                    )
            continue
        about.append(f"{name:<{ROW_WIDTH}} {row['kind']:<9} {row['about']}")
        if "skipped" in row:
            skipped.append(f"{name}: skipped, {row['skipped']}")
            continue
        for cache in ("warm", "cold"):
            figures = row.get(cache)
            if figures is None:
                continue
            if "skipped" in figures:
                skipped.append(f"{name} {cache}: skipped, {figures['skipped']}")
                continue
            cells = [_cell(figures, key, scale, fmt) for _, key, scale, fmt in GPU_COLUMNS]
            note = f"  {figures['note']}" if "note" in figures else ""
            lines.append(" ".join([f"{name:<{ROW_WIDTH}}", f"{cache:<5}", *cells]) + note)
    return "\n\n".join(["\n".join(lines), "\n".join(best + skipped), "\n".join(about)]).strip()


def verdicts(ratios: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per ratio that has a target (info ratios have none)."""
    return [verdict(name, r) for name, r in ratios.items() if r["op"]]


def format_gpu_document(document: Mapping[str, Any]) -> str:
    """Everything `bench --gpu` prints: the command, the machine, the table, the ratios and the
    verdicts."""
    machine = document["machine"]
    parts = [
        f"$ {document['command']}",
        f"machine: {machine['platform']}; {machine['cpus']} CPUs; load average (1 min)"
        f" {machine['load_average'][0]:.2f} before, {machine['load_average_after'][0]:.2f} after",
        format_table(document["table"], document["repetitions"]),
        format_ratios(document["ratios"]),
        "\n".join(verdicts(document["ratios"])),
    ]
    return "\n\n".join(parts)
