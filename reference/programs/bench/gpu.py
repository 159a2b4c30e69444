"""`python -m reference bench --gpu`: the GPU table, alone.

    python -m reference bench --gpu [--size-mib N] [--reps R] [--cache warm|cold|both]
                                    [--json PATH]

Writes, once per run and outside every measured run, the bench's DiT and VAE of about N MiB
(default 512) and diffusers' `WanTransformer3DModel` at the Wan2.1-T2V-1.3B config in bf16
(2.8 GB, `reference.programs.bench.wan`), then measures every row of
`reference.programs.bench.gpu_rows.GPU_ROWS` in each page-cache state: the reference's direct
DiT loads and its VAE stream onto the device, the peers on the same files, and the machine's
file-to-device limits. Every run is a fresh interpreter (spawned, never forked: a forked child
cannot use CUDA its parent initialised, and this process initialises none); the limit rows'
runs share one per repetition (`GpuRow.shares_process`). The figures are
medians per (row, cache); the ratios and their targets are `reference.programs.bench.gpu_ratios`.

Sized for a few minutes on one GPU: one repetition by default, a timed run per (row, cache)
and one sampled run per reference and peer row, each in its own fresh interpreter (18 of them
without the optional peers, each installed peer adds six), and the limit rows' runs (19 on 16
cores) together in one more.

A row that fails is shown skipped with its error's last line; the command exits 1 when a
reference row failed, 0 otherwise (also when a target is missed), and 2 without CUDA.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from reference.programs.bench.cache import CACHES
from reference.programs.bench.facts import checkpoint_facts, write_bench_models
from reference.programs.bench.gpu_ratios import compute_gpu_ratios, staging_bound
from reference.programs.bench.gpu_rows import (
    GPU_ROWS,
    LIMIT_MODEL,
    MODES,
    GpuJob,
    GpuRow,
    as_request,
    unavailable,
)
from reference.programs.bench.wan import TINY_WAN, WAN_1_3B, write_wan
from reference.request.platform import SYSTEM, Platform, describe

__all__ = [
    "CUDA_DEVICE",
    "GPU_REPS",
    "RUN_TIMEOUT_S",
    "SCHEMA",
    "WARMUP_MIB",
    "Runner",
    "gpu_command",
    "measure_table",
    "modes_for",
    "run_gpu_bench",
    "spawned",
    "write_gpu_folder",
]

Runner = Callable[[Sequence[dict[str, Any]]], list[dict[str, Any]]]
"""Runs jobs (requests, `gpu_rows.job_of`) in order in one fresh process; a result per job."""
SCHEMA = "reference-bench-gpu/1"
CUDA_DEVICE = "cuda:0"
GPU_REPS = 1
WARMUP_MIB = 1
RUN_TIMEOUT_S = 300
"""An interpreter still running after this long is stopped; the runs it did not answer are
shown failed."""


def write_gpu_folder(
    folder: Path, *, size_mib: int, wan: Mapping[str, Any] = WAN_1_3B
) -> dict[str, Any]:
    """Write the bench's DiT and VAE of about `size_mib` MiB (shapes.json, dit/, vae/) and, with
    diffusers installed, the Wan DiT at config `wan` (wan/); returns their facts by model, and
    as "limit" the facts of the files the limit rows read (`gpu_rows.files_of`)."""
    facts = write_bench_models(folder, size_mib)
    if importlib.util.find_spec("diffusers") is not None:
        facts["wan"] = checkpoint_facts(write_wan(folder / "wan", wan))
    facts[LIMIT_MODEL] = facts.get("wan", facts["dit"]) | {"of": "wan" if "wan" in facts else "dit"}
    return facts


def spawned(requests: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run jobs in order in one fresh interpreter (`python -m
    reference.programs.bench.gpu_rows JOB ...`); one result per job: its JSON line, or an
    error for each job it did not answer (the run died, or ran past `RUN_TIMEOUT_S`)."""
    root = Path(__file__).resolve().parents[3]  # the folder holding the reference package
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    argv = [sys.executable, "-m", "reference.programs.bench.gpu_rows"]
    argv += [json.dumps(request) for request in requests]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            timeout=RUN_TIMEOUT_S,
            env=dict(os.environ, PYTHONPATH=path),
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        stdout, why = out or "", f"the run took over {RUN_TIMEOUT_S} s"
    else:
        stdout = done.stdout
        why = f"the run exited {done.returncode}:\n{(done.stderr or '').strip()[-4000:]}"
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    results: list[dict[str, Any]] = [json.loads(line) for line in lines[: len(requests)]]
    return results + [{"row": r["row"], "error": why} for r in requests[len(results) :]]


def modes_for(
    row: GpuRow, cache: str, caches: Sequence[str], modes: Collection[str] = MODES
) -> tuple[str, ...]:
    """The modes `row` runs in `cache`, of those in `modes`: timed in each, sampled in the
    first it is measured in."""
    measured = [c for c in row.caches if c in caches]
    return tuple(m for m in row.modes if m in modes and (m == "time" or cache == measured[0]))


def _medians(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    keys = {k for run in runs for k, v in run.items() if isinstance(v, (int, float))}
    figures: dict[str, Any] = {
        k: statistics.median(r[k] for r in runs if k in r) for k in sorted(keys)
    }
    notes = sorted({run["note"] for run in runs if "note" in run})
    if notes:
        figures["note"] = "; ".join(notes)
    return figures


def _fastest(
    rows: Mapping[str, Mapping[str, Any]], cache: str, key: str, pick: Callable[..., Any]
) -> dict[str, Any] | None:
    measured = {name: row[cache] for name, row in rows.items() if key in row.get(cache, {})}
    if not measured:
        return None
    name = pick(measured, key=lambda n: measured[n][key])
    return {k: v for k, v in measured[name].items() if k != "runs"} | {"of": name}


def _row_reason(row: GpuRow, facts: Mapping[str, Any], device: str) -> str | None:
    if row.model not in facts:
        return f"no {row.model} checkpoint in this run (diffusers writes it: the [diffusers] extra)"
    return unavailable(row, torch.device(device))


@dataclass
class _Runs:
    """What the runs of one table gave: figures per (row, cache), refusals, failures."""

    figures: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    refused: dict[tuple[str, str], str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def take(self, name: str, cache: str, result: dict[str, Any]) -> None:
        """Keep one run's result, unless its row failed or its (row, cache) was refused."""
        if name in self.failed or (name, cache) in self.refused:
            return
        if "error" in result:
            self.failed[name] = result["error"]
        elif "skipped" in result:
            self.refused[name, cache] = result["skipped"]
        else:
            self.figures.setdefault((name, cache), []).append(result)


def _row_figures(
    name: str,
    row: GpuRow,
    reason: str | None,
    runs: _Runs,
    *,
    facts: Mapping[str, Any],
    caches: Sequence[str],
) -> dict[str, Any]:
    """One row of the table: its medians per cache, or why it (or a cache of it) was skipped."""
    head: dict[str, Any] = {"about": row.about, "kind": row.kind, "model": row.model}
    if name in runs.failed:
        last = runs.failed[name].strip().splitlines()[-1:] or ["?"]
        return head | {"skipped": f"failed: {last[0]}", "error": runs.failed[name]}
    if reason is not None:
        return head | {"skipped": reason}
    whole = row.kind in ("limit", "h2d")  # a limit moves the files' every byte
    size = facts[row.model]["file_bytes" if whole else "bytes"]
    entry = head | {"bytes": size}
    for cache in (c for c in caches if c in row.caches):
        if (name, cache) in runs.refused:
            entry[cache] = {"skipped": runs.refused[name, cache]}
        elif (name, cache) in runs.figures:
            figures = _medians(runs.figures[name, cache])
            if "load_s" in figures:
                figures["throughput"] = size / figures["load_s"]
            entry[cache] = figures | {"runs": runs.figures[name, cache]}
    return entry


def _best(paths: Mapping[str, Mapping[str, Any]], caches: Sequence[str]) -> dict[str, Any]:
    """The pseudo-rows `best_limit` (fastest limit per cache) and `best_peer_<model>`."""
    measured = {n: r for n, r in paths.items() if "skipped" not in r}
    limits = {n: r for n, r in measured.items() if r["kind"] == "limit"}
    best: dict[str, dict[str, Any]] = {"best_limit": {"about": "the fastest limit row"}}
    for cache in caches:
        fastest = _fastest(limits, cache, "throughput", max)
        if fastest is not None:
            best["best_limit"][cache] = fastest
    for model in ("dit", "wan"):
        peers = {n: r for n, r in measured.items() if (r["kind"], r["model"]) == ("peer", model)}
        entry: dict[str, Any] = {"about": f"the fastest peer on the {model} files"}
        for cache in caches:
            fastest = _fastest(peers, cache, "load_s", min)
            if fastest is not None:
                entry[cache] = fastest
        best[f"best_peer_{model}"] = entry
    return best


def measure_table(
    folder: Path,
    facts: Mapping[str, Any],
    *,
    reps: int,
    runner: Runner,
    device: str = CUDA_DEVICE,
    warmup: Path | None = None,
    caches: Sequence[str] = CACHES,
    modes: Collection[str] = MODES,
) -> dict[str, Any]:
    """Run every available row `reps` times (repetition-major) in each of `caches` it is
    measured in, in each of its modes that `modes` holds (both by default; `("time",)`: no
    sampled runs, one run per row and cache); returns the table: the models' facts, each
    row's medians per cache (or why it was skipped), the best limit and best peers, and the
    ratios. A cold run that could not drop its pages marks that (row, cache) skipped; a failed
    run marks its row failed; neither is run again."""
    runs = _Runs()
    reasons = {name: _row_reason(row, facts, device) for name, row in GPU_ROWS.items()}
    for _ in range(reps):
        shared: list[dict[str, Any]] = []
        for name, row in GPU_ROWS.items():
            if reasons[name] is not None:
                continue
            for cache in (c for c in caches if c in row.caches):
                for mode in modes_for(row, cache, caches, modes):
                    if (name, cache) in runs.refused or name in runs.failed:
                        break
                    job = GpuJob(
                        row=name,
                        folder=folder,
                        device=device,
                        mode=mode,
                        cache=cache,
                        warmup=warmup,
                    )
                    if row.shares_process:
                        shared.append(as_request(job))
                    else:
                        runs.take(name, cache, runner([as_request(job)])[0])
        for request, result in zip(shared, runner(shared) if shared else [], strict=True):
            runs.take(request["row"], request["cache"], result)
    paths = {
        name: _row_figures(name, row, reasons[name], runs, facts=facts, caches=caches)
        for name, row in GPU_ROWS.items()
    }
    table = dict(facts) | {"paths": paths | _best(paths, caches), "caches": list(caches)}
    table["staging_bound"] = staging_bound()
    table["failed"] = sorted(runs.failed)
    names = [r["device_name"] for rs in runs.figures.values() for r in rs if "device_name" in r]
    table["device"] = device + (f" ({names[0]})" if names else "")
    table["ratios"] = compute_gpu_ratios(table)
    return table


def run_gpu_bench(
    *,
    size_mib: int,
    reps: int,
    command: str,
    caches: Sequence[str] = CACHES,
    device: str = CUDA_DEVICE,
    runner: Runner = spawned,
    wan: Mapping[str, Any] = WAN_1_3B,
    platform: Platform = SYSTEM,
    modes: Collection[str] = MODES,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """Write the checkpoints into a temporary folder, measure the table (in `modes`, as
    `measure_table` runs them); returns the JSON document ({"schema", "command",
    "repetitions", "machine", "table", "ratios"})."""
    document: dict[str, Any] = {"schema": SCHEMA, "command": command, "repetitions": reps}
    document["machine"] = {
        "platform": describe(platform),
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "load_average": list(os.getloadavg()),
    }
    with tempfile.TemporaryDirectory(prefix="reference-bench-gpu-") as tmp:
        warmup = Path(tmp) / "warmup"
        write_gpu_folder(warmup, size_mib=WARMUP_MIB, wan=TINY_WAN)
        folder = Path(tmp) / "table"
        log(f"writing the {size_mib} MiB DiT and VAE and the Wan DiT into {folder}")
        facts = write_gpu_folder(folder, size_mib=size_mib, wan=wan)
        log(f"measuring the GPU table on {device}: {reps} repetition(s), {' and '.join(caches)}")
        table = measure_table(
            folder,
            facts,
            reps=reps,
            runner=runner,
            device=device,
            warmup=warmup,
            caches=caches,
            modes=modes,
        )
    document["machine"]["load_average_after"] = list(os.getloadavg())
    document["table"] = table
    document["ratios"] = table["ratios"]
    return document


def gpu_command(
    argv: Sequence[str],
    *,
    size_mib: int,
    reps: int | None,
    caches: Sequence[str],
    json_path: Path | None,
    platform: Platform = SYSTEM,
    runner: Runner = spawned,
    wan: Mapping[str, Any] = WAN_1_3B,
) -> int:
    """`python -m reference bench --gpu ...` once its arguments are parsed: without CUDA, one
    line on stderr and 2; else the table printed (and written as JSON to `json_path`), and 1
    when a reference row failed, else 0."""
    from reference.programs.bench.gpu_report import format_gpu_document

    if not platform.cuda_available():
        print(
            f"bench --gpu: needs CUDA; this machine has none ({describe(platform)})",
            file=sys.stderr,
        )
        return 2
    command = shlex.join(["python", "-m", "reference", "bench", *argv])
    document = run_gpu_bench(
        size_mib=size_mib,
        reps=GPU_REPS if reps is None else reps,
        command=command,
        caches=caches,
        runner=runner,
        wan=wan,
        platform=platform,
    )
    print(format_gpu_document(document))
    if json_path is not None:
        json_path.write_text(json.dumps(document, indent=2) + "\n")
    paths = document["table"]["paths"]
    reference_failed = [n for n in document["table"]["failed"] if paths[n]["kind"] == "reference"]
    return 1 if reference_failed else 0
