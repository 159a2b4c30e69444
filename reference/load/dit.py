"""Loading one DiT component: plan -> checkpoint -> adopt or copy -> post-load -> report.

The model is built by a zero-argument factory with its parameters and persistent buffers on
`meta` (construction keeps none of them) and its non-persistent buffers computed for real, as the
VAE is built (`build_dit`); each slot then gets its tensor from the
checkpoint, one tensor at a time. Nothing is returned until the whole load succeeded, and the
checkpoint files are only ever mapped privately (never written).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from reference.errors import StateMismatchError, listed, shown
from reference.place.adopt import (
    REFERENCE_ADOPT_STEPS,
    AdoptSteps,
    LinearKinds,
    keeps_read_tensor,
    load_full_state,
    zero_copy_verdict,
)
from reference.place.cast import cast_slots
from reference.place.host_memory import (
    COPY_FIX,
    available_host_bytes,
    construction_guard,
    refuse_beyond_host,
)
from reference.place.modules import (
    build_on_meta,
    find_slots,
    rebuild_non_persistent_buffers,
    refuse_unrebuildable_buffers,
)
from reference.place.postload import effective_plan, offload_to_cpu, process_weights
from reference.read.checkpoint import (
    Checkpoint,
    TensorInfo,
    TensorReader,
    open_checkpoint,
    skipped_notes,
)
from reference.read.pool import PooledReader
from reference.read.reading import ReadOptions, pool_options, prefetch_workers
from reference.report.summary import LoadReport
from reference.request.plan import WeightLoadPlan
from reference.request.quantization import QuantizationSpec

__all__ = [
    "REFERENCE_DIT_STEPS",
    "DiTSteps",
    "build_dit",
    "check_names",
    "dit_reader",
    "load_dit",
]


def check_names(
    module: nn.Module, names: set[str], *, component: str, files: Sequence[Path] = ()
) -> None:
    """CKPT-3: the checkpoint's names are exactly the module's slots (aliases count), checked
    from the headers before any tensor is read.

    Raises:
        StateMismatchError: listing the unknown and the missing names.
    """
    found = find_slots(module)
    slots, aliases = found.by_name, found.aliases
    where = f" ({listed(sorted({f.name for f in files}))})" if files else ""
    unknown = sorted(names - set(slots) - set(aliases))
    missing = sorted(set(slots) - names)
    if unknown or missing:
        raise StateMismatchError(
            f"{component}: checkpoint{where} and model disagree before any tensor was read;"
            f" unknown in the model: {listed(unknown) or 'none'};"
            f" missing from the checkpoint: {listed(missing) or 'none'}"
        )


def build_dit(
    build: Callable[[], nn.Module],
    *,
    component: str,
    dtype: torch.dtype | None = None,
    checkpoint: Checkpoint | None = None,
) -> nn.Module:
    """Construct the DiT as the VAE is constructed (reference.place.modules.build_on_meta):
    parameters and persistent buffers go to `meta` as they are registered, while non-persistent
    buffers (rotary tables, index ranges) are computed for real on the default device, as an
    ordinary construction computes them; the load moves them to its device afterwards
    (`rebuild_non_persistent_buffers`). A buffer construction itself leaves on meta needs a
    `rebuild_buffers(device)` method on its submodule; without one the load is refused here,
    naming it, before any tensor data is read.

    Construction never runs under the load device: a layer allocates its parameter before it
    registers it, so a build under a CUDA device would book every parameter on the device once
    more before it went to meta (DG-5 counts device allocations).

    With `dtype`, the slots are then given the component's precision on meta
    (`reference.request.precision.cast_slots`: PREC-1, PREC-2). With `checkpoint`, the construction
    may take no more host memory than that checkpoint explains
    (`reference.place.host_memory.construction_budget`: a config.json that sizes a table far past
    the weights is refused before the table is allocated).

    Raises:
        StateDictABIError: non-persistent buffers on meta that no `rebuild_buffers` recomputes.
        HostMemoryError: the construction would take more host memory than it may.
    """
    total = None if checkpoint is None else checkpoint.total_bytes
    with construction_guard(component, checkpoint_bytes=total, ordinary=False):
        module = build_on_meta(build, component=component)
    refuse_unrebuildable_buffers(module, component=component)
    if dtype is not None:
        cast_slots(module, dtype)
    return module


def dit_reader(
    checkpoint: Checkpoint,
    module: nn.Module,
    *,
    reading: ReadOptions | None,
    copies_every_tensor: bool,
    device: torch.device,
    kinds: LinearKinds,
) -> TensorReader:
    """The reference's reader for one DiT load into `module` (built, not yet loaded).

    A load that copies every tensor (adoption off, or direct mode: every tensor goes to the
    device, where it is adopted) reads through the pool where `reference.read.reading.pool_options`
    says so (by default the copy path onto the CPU; given options, both). On a CPU load
    device the pool reads the tensors whose buffers become the loaded tensors as they are
    (`reference.place.adopt.keeps_read_tensor`, or the zero-copy verdict: a standard layer's loader
    at TP=1 copies the tensor unchanged); the others (a layer's `weight_loader` fills them, or
    they are converted) are copied from the file's map, so no tensor is copied twice. A load
    that may adopt CPU tensors needs views of the file's map (`TensorReader`), populated in the
    background when `reading.prefetch`.
    """
    pool = pool_options(reading, device=device, load="dit") if copies_every_tensor else None
    if pool is None:
        return TensorReader(checkpoint, prefetch=prefetch_workers(reading))
    if device.type != "cpu":
        return PooledReader(checkpoint, pool)
    slots = find_slots(module).by_name
    probe = TensorReader(checkpoint)  # map views to judge by: nothing is read

    def kept(info: TensorInfo) -> bool:
        slot = slots.get(info.name)
        if slot is None:
            return False
        if keeps_read_tensor(slot, info.dtype, info.shape, device):
            return True
        # A standard layer's loader at TP=1 copies the tensor unchanged (the zero-copy verdict
        # holds): its fresh buffer can be the parameter.
        view = probe.read(info.name, device=device)
        return (
            slot.is_parameter
            and zero_copy_verdict(slot.tensor, view, slot.tensor, kinds=kinds).adopt
        )

    try:
        return PooledReader(checkpoint, pool, pooled=kept, buffers_kept=True)
    finally:
        probe.close()


def own_memory_check(
    module: nn.Module,
    adopt: AdoptSteps,
    *,
    kinds: LinearKinds,
    device: torch.device,
    direct: bool,
) -> Callable[[str, torch.Tensor], bool]:
    """Whether a tensor read as a view of the file's map must first get memory of its own.

    PLAN-3: direct mode onto the CPU adopts fresh host memory, never the file's map, so a view
    the zero-copy verdict would adopt is copied once before it is adopted. Every other load
    (and every tensor the verdict copies anyway) is left as read.
    """
    if not (direct and device.type == "cpu"):
        return lambda name, tensor: False
    slots = find_slots(module).by_name

    def needed(name: str, tensor: torch.Tensor) -> bool:
        slot = slots.get(name)
        return (
            slot is not None
            and slot.is_parameter
            and adopt.verdict(
                slot.tensor, tensor, slot.tensor, kinds=kinds, direct_device=device
            ).adopt
        )

    return needed


@dataclass(frozen=True)
class DiTSteps:
    """The steps of `load_dit` a caller may replace, each with the reference's default: the
    adoption steps, the tensor reader, the name check before reading, weight processing and the
    deferred offload. A loader that differs in one step passes its own (`Platform`'s way).

    `reader` None is the reference's choice (`dit_reader`, tuned by `load_dit`'s `reading`); a
    reader given here reads every load, whatever `reading` says."""

    adopt: AdoptSteps = REFERENCE_ADOPT_STEPS
    reader: Callable[[Checkpoint], TensorReader] | None = None
    check_names: Callable[..., None] = check_names
    process: Callable[..., int] = process_weights
    offload: Callable[[nn.Module], None] = offload_to_cpu


REFERENCE_DIT_STEPS = DiTSteps()


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
    reading: ReadOptions | None = None,
    steps: DiTSteps = REFERENCE_DIT_STEPS,
    host_bytes: int | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[nn.Module, LoadReport]:
    """Load a DiT component as `plan` says and report what happened to each tensor.

    Tensors are read from the files onto `plan.checkpoint_load_device`, one at a time (in direct
    mode too: no CPU pre-read of the checkpoint, DG-4). Eligible tensors are adopted: CPU tensors
    in ordinary mode (ZC-1..8), device tensors in direct mode (DG-5). Then `rebuild_buffers`
    hooks run and non-persistent buffers move to the load device, layers process their weights
    (on the post-process device, FP8-2/3), and a deferred component moves to CPU last (FP8-2,
    FP8-6). Under FSDP the plan's post-process override and deferral are dropped with a warning
    (FP8-4).

    Args:
        build: makes the model; called once, with parameters and persistent buffers sent to
            `meta` as they are registered (see `build_dit`).
        checkpoint: a safetensors file, shard index, or folder.
        plan: where tensors land and what happens after.
        kinds: the standard linear classes and unquantized method (for the zero-copy rule).
        quantization: the requested quantization, if any (it is never silently dropped).
        fsdp: FSDP inference is on (FSDP itself is not done here).
        component: the component's name, for messages and the report.
        adopt: False copies every tensor, eligible or not (the benchmark's copy path).
        reading: how the files are read (`reference.read.reading.ReadOptions`); None is the default:
            the copy path onto the CPU (adopt=False) reads through the reader pool with
            `ReadOptions()`, every other load reads views of the file's map, without prefetch.
            Given options (`workers` of 1 or more) send the loads that copy every tensor
            (adopt=False, direct mode) through the pool, whose buffers become the copied
            tensors where no conversion is involved and the layer has no `weight_loader` or a
            standard one at TP=1 (see `dit_reader`); `workers=0` reads every load from the map;
            `prefetch` populates a zero-copy load's maps in the background (the load does not
            wait for it).
        steps: the steps of the load (see `DiTSteps`); the reference's by default.
        dtype: the component's precision (PREC-1): its slots are given this dtype on meta,
            before any tensor is read, except modules the class keeps in fp32 and integer or
            float8 slots (PREC-2, `reference.request.precision.cast_slots`); a checkpoint tensor of
            another dtype is converted once (PREC-4). None keeps the dtypes the build gives.
        host_bytes: the host memory the load may take (default: what the host has available,
            `reference.place.host_memory.available_host_bytes`). A load onto the CPU that would copy
            more than this is refused before it allocates: with `adopt=False` from the headers,
            before the build; otherwise at the copy that would pass it.

    Returns:
        The loaded module (in eval mode) and its load report.

    Raises:
        CheckpointError: the checkpoint is malformed.
        StateMismatchError: checkpoint and model disagree (names before any read; shapes).
        QuantizationLoadError: quantization was requested and could not be applied (FP8-5).
        HostMemoryError: the copies onto the CPU would not fit in `host_bytes`.
    """
    started = time.perf_counter()
    plan = effective_plan(plan, fsdp=fsdp, component=component)
    opened = open_checkpoint(checkpoint)
    device = plan.checkpoint_load_device
    if device.type == "cpu":
        host_bytes = available_host_bytes() if host_bytes is None else host_bytes
        if not adopt:
            what = "copying every tensor"
            refuse_beyond_host(
                component, opened.total_bytes, available=host_bytes, what=what, fix=COPY_FIX
            )
    module = build_dit(build, component=component, dtype=dtype, checkpoint=opened)
    steps.check_names(module, set(opened.tensors), component=component, files=opened.files)
    direct = plan.load_full_state_dict_on_device
    if steps.reader is not None:
        reader = steps.reader(opened)
    else:
        reader = dit_reader(
            opened,
            module,
            reading=reading,
            copies_every_tensor=direct or not adopt,
            device=device,
            kinds=kinds,
        )
    in_flight: list[str] = []  # the tensor being loaded, so a mismatch can name its file
    fresh = set(reader.fresh_names)
    own_memory = own_memory_check(module, steps.adopt, kinds=kinds, device=device, direct=direct)

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for name in reader:
            in_flight[:] = [name]
            tensor = reader.read(name, device=device)
            if name not in fresh and own_memory(name, tensor):
                tensor = tensor.clone()
                fresh.add(name)
            yield name, tensor
        in_flight.clear()

    failure: StateMismatchError | None = None
    try:
        records = load_full_state(
            module,
            tensors(),
            load_device=device,
            kinds=kinds,
            direct=direct,
            adopt=adopt,
            fresh=fresh,
            steps=steps.adopt,
            host_bytes=host_bytes if device.type == "cpu" else None,
            component=component,
        )
    except StateMismatchError as exc:
        if not in_flight:
            raise
        file = opened.tensors[in_flight[0]].file
        failure = StateMismatchError(f"{exc} (tensor of {shown(file)})")
        # The weight_loader's assertion stays the cause; `exc` is not chained, since its
        # traceback holds the half-loaded module (CKPT-5: nothing of a failed load survives).
        failure.__cause__ = exc.__cause__
    finally:
        reader.close()
    if failure is not None:
        raise failure
    events = ["load"]
    rebuild_non_persistent_buffers(module, device=device, component=component)
    if steps.process(module, quantization=quantization, kinds=kinds, component=component):
        events.append("process")
    if plan.defer_cpu_offload:
        steps.offload(module)
        events.append("offload")
    report = LoadReport(
        component=component,
        plan=plan,
        records=records,
        seconds=time.perf_counter() - started,
        events=tuple(events),
        notes=skipped_notes(opened.skipped),
        precision=dtype,
    )
    # In eval mode, as diffusers' from_pretrained returns a model.
    return module.eval(), report
