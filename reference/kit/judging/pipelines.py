"""Whole-pipeline loads reached through a `SeamLoader` (PIPE-1..4), as module-level functions
an isolated attempt (`reference.kit.isolated.attempt_with`) can run in a fresh process.

The pipelines are `fakes.pipeline_loads`' (every tensor stored in fp32): `args_in` asks for
every component in bf16 but the VAE (fp32), so every tensor but the VAE's is converted and
none can stay a view of its file: the bytes any loader must hold at the end are known from
the headers alone (`held_bytes`), whatever it adopts where it may.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from fakes.pipeline_loads import tracked_classes
from fakes.platform import FakePlatform
from reference.kit.seam import (
    ComponentRequest,
    PipelineRequest,
    Precisions,
    SeamLoader,
    ServerArgsLike,
    ServingOptions,
)
from reference.report.memory import PeakSampler, resident

__all__ = [
    "CPU",
    "PRECISIONS",
    "args_in",
    "component_growth",
    "held_bytes",
    "largest_bytes",
    "load_whole",
    "memory_kept_by_a_failed_load",
    "open_files_under",
    "pipeline_growth",
    "threads_started_since",
]

CPU = torch.device("cpu")
BF16, FP32 = torch.bfloat16, torch.float32
PRECISIONS = Precisions(dit=BF16, vae=FP32, components={"text_encoder": BF16})
"""Every component converted on the way in (its files are fp32), the VAE aside."""


def args_in(loader: SeamLoader, device: torch.device) -> ServerArgsLike:
    """The loader's arguments for a whole-pipeline load on `device` in `PRECISIONS`."""
    return loader.make_server_args(ServingOptions(runtime_device=device, precisions=PRECISIONS))


def held_bytes(root: Path) -> dict[str, int]:
    """Per component of the pipeline at `root`, the bytes its slots take in `PRECISIONS` (what
    any loader holds at the end: converted tensors cannot be views of the files)."""
    return {name: sum(sizes) for name, sizes in _slot_sizes(root).items()}


def largest_bytes(root: Path) -> dict[str, int]:
    """Per component of the pipeline at `root`, its largest tensor in `PRECISIONS` (what may be
    in flight beside it while it loads)."""
    return {name: max(sizes) for name, sizes in _slot_sizes(root).items()}


def _slot_sizes(root: Path) -> dict[str, list[int]]:
    from safetensors import safe_open

    dtypes = {"vae": FP32}
    found: dict[str, list[int]] = {}
    for file in sorted(root.glob("*/*.safetensors")):
        component = file.parent.name
        dtype = dtypes.get(component, BF16)
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
                numel = 1
                for size in f.get_slice(name).get_shape():
                    numel *= size
                found.setdefault(component, []).append(numel * dtype.itemsize)
    return found


def load_whole(
    loader: SeamLoader,
    root: Path,
    *,
    device: torch.device = CPU,
    platform: FakePlatform | None = None,
    models: Mapping[str, type[nn.Module]] | None = None,
) -> Mapping[str, nn.Module]:
    """`loader.load_pipeline` of the pipeline at `root` in `PRECISIONS`; its components."""
    request = PipelineRequest(
        root,
        args=args_in(loader, device),
        platform=platform or FakePlatform(cuda=False),
        models=tracked_classes() if models is None else models,
    )
    return loader.load_pipeline(request).components


def pipeline_growth(loader: SeamLoader, root: Path) -> int:
    """A whole-pipeline load on the CPU: the peak anonymous host memory it took above the
    process's state before it."""
    gc.collect()
    with PeakSampler() as host:
        components = load_whole(loader, root)
    del components
    return host.anon_growth


def component_growth(loader: SeamLoader, root: Path, component: str) -> int:
    """One component of the pipeline at `root` loaded alone on the CPU, in `PRECISIONS`
    (`load_pipeline_component`): the peak anonymous host memory it took above the process's
    state before it."""
    request = ComponentRequest(
        root,
        component,
        args_in(loader, CPU),
        platform=FakePlatform(cuda=False),
        models=tracked_classes(),
    )
    gc.collect()
    with PeakSampler() as host:
        module = loader.load_pipeline_component(request)
    del module
    return host.anon_growth


def memory_kept_by_a_failed_load(loader: SeamLoader, root: Path) -> int:
    """A whole-pipeline load on the CPU that fails: the anonymous host memory the process holds
    after it above its state before it, once the C allocator has given back what was freed
    (`malloc_trim`: memory a loader freed is not the loader's to keep)."""
    gc.collect()
    before = resident().anon
    with contextlib.suppress(Exception):  # the failure under test: its memory is judged
        load_whole(loader, root)
    gc.collect()
    _trim()
    return max(resident().anon - before, 0)


def _trim() -> None:
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to give back so
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def threads_started_since(before: set[int]) -> list[str]:
    """Threads alive now that were not in `before` (idents), by name; waits up to 2 s for
    threads that are ending."""
    for _ in range(200):
        extra = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
        if not extra:
            return []
        threading.Event().wait(0.01)
    return extra


def open_files_under(root: Path) -> list[str]:
    """Files under `root` that this process holds open (/proc/self/fd)."""
    found = []
    prefix = str(root.resolve())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix):
            found.append(target)
    return found
