"""Loading one DiT component: plan -> checkpoint -> adopt or copy -> post-load -> report.

The model is built on `meta` by a zero-argument factory, so construction allocates nothing; each
slot then gets its tensor from the checkpoint, one tensor at a time. Nothing is returned until the
whole load succeeded, and the checkpoint files are only ever mapped privately (never written).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from reference.adopt import LinearKinds, find_slots, load_full_state
from reference.checkpoint import TensorReader, open_checkpoint
from reference.errors import StateMismatchError
from reference.plan import WeightLoadPlan
from reference.postload import (
    effective_plan,
    offload_to_cpu,
    process_weights,
    rebuild_non_persistent_buffers,
)
from reference.quantization import QuantizationSpec
from reference.report import LoadReport


def _preflight(module: nn.Module, names: set[str], *, component: str) -> None:
    slots, aliases = find_slots(module)
    unknown = sorted(names - set(slots) - set(aliases))
    missing = sorted(set(slots) - names)
    if unknown or missing:
        raise StateMismatchError(
            f"{component}: checkpoint and model disagree before any tensor was read;"
            f" unknown in the model: {', '.join(unknown) or 'none'};"
            f" missing from the checkpoint: {', '.join(missing) or 'none'}"
        )


def load_dit(
    build: Callable[[], nn.Module],
    checkpoint: str | os.PathLike[str],
    *,
    plan: WeightLoadPlan,
    kinds: LinearKinds,
    quantization: QuantizationSpec | None = None,
    fsdp: bool = False,
    component: str = "transformer",
    adopt: bool = True,
) -> tuple[nn.Module, LoadReport]:
    """Load a DiT component as `plan` says and report what happened to each tensor.

    Tensors are read from the files onto `plan.checkpoint_load_device`, one at a time (in direct
    mode too: no CPU pre-read of the checkpoint, DG-4). Eligible tensors are adopted: CPU tensors
    in ordinary mode (ZC-1..8), device tensors in direct mode (DG-5). Then the module's buffer hook
    runs, layers process their weights (on the post-process device, FP8-2/3), and a deferred
    component moves to CPU last (FP8-2, FP8-6). Under FSDP the plan's post-process override and
    deferral are dropped with a warning (FP8-4).

    Args:
        build: makes the model; called once, under `torch.device("meta")`.
        checkpoint: a safetensors file, shard index, or folder.
        plan: where tensors land and what happens after.
        kinds: the standard linear classes and unquantized method (for the zero-copy rule).
        quantization: the requested quantization, if any (it is never silently dropped).
        fsdp: FSDP inference is on (FSDP itself is not done here).
        component: the component's name, for messages and the report.
        adopt: False copies every tensor, eligible or not (the benchmark's copy path).

    Returns:
        The loaded module and its load report.

    Raises:
        CheckpointError: the checkpoint is malformed.
        StateMismatchError: checkpoint and model disagree (names before any read; shapes).
        QuantizationLoadError: quantization was requested and could not be applied (FP8-5).
    """
    started = time.perf_counter()
    plan = effective_plan(plan, fsdp=fsdp, component=component)
    opened = open_checkpoint(checkpoint)
    with torch.device("meta"):
        module = build()
    _preflight(module, set(opened.tensors), component=component)
    device = plan.checkpoint_load_device
    reader = TensorReader(opened)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name in reader:
            yield name, reader.read(name, device=device)

    try:
        records = load_full_state(
            module,
            tensors(),
            load_device=device,
            kinds=kinds,
            direct=plan.load_full_state_dict_on_device,
            adopt=adopt,
        )
    finally:
        reader.close()
    events = ["load"]
    rebuild_non_persistent_buffers(module, device, component=component)
    if process_weights(module, quantization=quantization, kinds=kinds, component=component):
        events.append("process")
    if plan.defer_cpu_offload:
        offload_to_cpu(module)
        events.append("offload")
    report = LoadReport(
        component=component,
        plan=plan,
        records=records,
        seconds=time.perf_counter() - started,
        events=tuple(events),
    )
    return module, report
