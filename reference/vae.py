"""Direct VAE loading: build on meta, prove the state-dict ABI, preflight, stream, finish.

One load, in order:
  1. refusals (VAE-12): quantization or custom code (`auto_map`) in the config, a quantization
     request, or quantization declared in the checkpoint's own metadata;
  2. headers: `open_checkpoint` validates every file and the shard index (CKPT-2, CKPT-4);
  3. build on `meta` (VAE-1, VAE-9): parameters and persistent buffers go to `meta` as they are
     registered, while non-persistent buffers are computed as an ordinary construction computes
     them (real values); a buffer construction itself leaves on meta with no
     `rebuild_buffers(device)` hook to recompute it is refused here, as is a decode dtype the
     VAE cannot hold (VAE-11);
  4. slots (VAE-2..6): the standard state-dict ABI on every submodule, no tied state;
  5. preflight (CKPT-3): names and shapes from the headers against the slots;
  6. stream (VAE-1, VAE-7, VAE-10): one tensor at a time into its slot on `device`, each file
     mapped only while its tensor is copied, so memory holds the module and one tensor;
  7. after the stream (VAE-8, VAE-9): `rebuild_buffers` hooks run, buffers moved to `device`,
     state unchanged by hooks;
  8. policy (VAE-11): channels_last_3d and decode dtype, as on the ordinary path.
CPU and CUDA targets run the same code; the device is an argument (VAE-13). The caller gets a
complete module or an exception, never a half-loaded module (CKPT-5).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules.module import register_module_parameter_registration_hook
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

from reference.checkpoint import StreamingReader, open_checkpoint
from reference.errors import ComponentCheckpointUnsupportedError
from reference.plan import WeightLoadPlan
from reference.quantization import QuantizationSpec
from reference.report import LoadReport
from reference.slots import state_slots
from reference.stream import preflight, stream
from reference.vae_postload import (
    apply_vae_policy,
    check_state_kept,
    rebuild_non_persistent_buffers,
    refuse_unrebuildable_buffers,
    require_decode_dtype_support,
)

# Where a VAE's quantization shows up: its component config, or its checkpoint's __metadata__.
QUANTIZATION_KEYS = ("quantization_config", "quant_method")


def refuse_unsupported_config(
    component: str, config: Mapping[str, object] | None, quantization: QuantizationSpec | None
) -> None:
    """VAE-12: refuse what direct streaming cannot honour, before any file is opened.

    Raises:
        ComponentCheckpointUnsupportedError: for a quantization request, a quantization config,
            or custom code (`auto_map`); no generic fallback loader is tried.
    """
    config = config or {}
    found = [key for key in QUANTIZATION_KEYS if key in config]
    if quantization is not None or found:
        what = f"quantization {quantization.method!r}" if quantization else f"config {found[0]}"
        raise ComponentCheckpointUnsupportedError(
            f"{component}: direct VAE loading was requested for a quantized VAE ({what});"
            " streaming fills native slots only and does not fall back to a generic loader."
            f" Drop the direct-loading flag for {component}"
        )
    if config.get("auto_map"):
        raise ComponentCheckpointUnsupportedError(
            f"{component}: the config declares custom code (auto_map: {config['auto_map']!r});"
            " direct VAE loading builds native classes only and never runs code shipped with a"
            f" checkpoint. Drop the direct-loading flag for {component}"
        )


def refuse_quantized_metadata(
    component: str, file_metadata: Mapping[Path, Mapping[str, str]]
) -> None:
    """VAE-12b: a checkpoint whose own metadata (in any of its files) declares quantization is
    refused.

    Raises:
        ComponentCheckpointUnsupportedError: naming the key and the file.
    """
    for file, metadata in file_metadata.items():
        found = [key for key in QUANTIZATION_KEYS if key in metadata]
        if found:
            raise ComponentCheckpointUnsupportedError(
                f"{component}: {file.name} declares {found[0]} in its metadata; direct VAE"
                " loading does not load quantized checkpoints and does not fall back to a"
                f" generic loader. Drop the direct-loading flag for {component}"
            )


class _MetaState:
    """Sends parameters and persistent buffers to `meta` as a module registers them.

    Everything else that construction computes (non-persistent buffers: frequency tables,
    wavelet filters, index ranges) runs as it always does, on the default device, so it holds
    its real values (VAE-9). This is the way of accelerate's
    `init_empty_weights(include_buffers=False)`, which diffusers' own low-memory load uses (so
    every diffusers class builds under it), except that persistent buffers go to meta too: the
    checkpoint fills them. One tensor registered under two names stays one tensor (ties are
    kept for VAE-6).

    Registration is intercepted through torch's global parameter-registration hook and a
    wrapper of `nn.Module.register_buffer`; both act only in the thread (context) that is
    building, and are removed when the last build ends.
    """

    active: ContextVar[dict[int, tuple[torch.Tensor, torch.Tensor]] | None] = ContextVar(
        "meta_state", default=None
    )
    lock = threading.Lock()
    users = 0
    hook: RemovableHandle | None = None
    register_buffer = nn.Module.register_buffer

    @classmethod
    def to_meta(cls, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` on meta (same class, attributes, requires_grad), once per tensor."""
        memo = cls.active.get()
        if memo is None or tensor.is_meta or is_lazy(tensor):
            return tensor
        seen = memo.get(id(tensor))
        if seen is None:
            meta = torch.Tensor._make_subclass(
                type(tensor), tensor.detach().to("meta"), tensor.requires_grad
            )
            meta.__dict__.update(tensor.__dict__)
            try:
                # In place: the caller's object itself goes to meta, so attributes it sets on
                # that object after registering it (a layer's `weight_loader`) are kept.
                torch.utils.swap_tensors(tensor, meta)  # type: ignore[no-untyped-call]
                tensor, meta = meta, tensor
            except RuntimeError:  # a view or weakly referenced tensor: register the meta copy
                pass
            # The original is kept so that its id is not reused while the build runs.
            seen = memo[id(tensor)] = (tensor, meta)
        return seen[1]

    @classmethod
    def on_parameter(cls, module: nn.Module, name: str, param: nn.Parameter) -> torch.Tensor:
        return cls.to_meta(param)

    @staticmethod
    def on_buffer(
        module: nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True
    ) -> None:
        if tensor is not None and persistent:
            tensor = _MetaState.to_meta(tensor)
        _MetaState.register_buffer(module, name, tensor, persistent)

    @classmethod
    @contextmanager
    def building(cls) -> Iterator[None]:
        with cls.lock:
            if cls.users == 0:
                cls.hook = register_module_parameter_registration_hook(cls.on_parameter)  # type: ignore[arg-type]
                nn.Module.register_buffer = cls.on_buffer  # type: ignore[method-assign,assignment]
            cls.users += 1
        token = cls.active.set({})
        try:
            yield
        finally:
            cls.active.reset(token)
            with cls.lock:
                cls.users -= 1
                if cls.users == 0:
                    nn.Module.register_buffer = cls.register_buffer  # type: ignore[method-assign]
                    assert cls.hook is not None
                    cls.hook.remove()

    @classmethod
    def settle(cls, module: nn.Module) -> None:
        """Send to meta what bypassed registration (a tensor assigned over an existing buffer,
        or written into `_parameters` directly), keeping ties."""
        token = cls.active.set({})
        try:
            for sub in module.modules():
                for attr, param in sub._parameters.items():
                    if param is not None:
                        sub._parameters[attr] = cls.to_meta(param)  # type: ignore[assignment]
                for attr, buf in sub._buffers.items():
                    if buf is not None and attr not in sub._non_persistent_buffers_set:
                        sub._buffers[attr] = cls.to_meta(buf)
        finally:
            cls.active.reset(token)


def build_on_meta(build: Callable[[], nn.Module], *, component: str) -> nn.Module:
    """VAE-1, VAE-9: run `build()` with every parameter and persistent buffer on `meta`.

    No parameter or persistent buffer storage is kept (each is sent to meta as it is
    registered); non-persistent buffers are computed as an ordinary construction computes them,
    so they hold their real values.

    Raises:
        TypeError: `build` did not return an `nn.Module`.
    """
    with _MetaState.building():
        module = build()
    if not isinstance(module, nn.Module):
        raise TypeError(f"{component}: build() returned {type(module).__name__}, not an nn.Module")
    _MetaState.settle(module)
    return module


def load_vae(
    build: Callable[[], nn.Module],
    checkpoint_path: str | os.PathLike[str],
    *,
    device: torch.device,
    component: str = "vae",
    config: Mapping[str, object] | None = None,
    quantization: QuantizationSpec | None = None,
    decode_dtype: torch.dtype | None = None,
    channels_last_3d: bool = False,
) -> tuple[nn.Module, LoadReport]:
    """Load a VAE by streaming its checkpoint tensor by tensor into a module built on meta.

    dtype policy: a checkpoint tensor whose dtype differs from its slot's is converted to the
    slot's dtype once, on the way into the slot (the record says so).

    Args:
        build: constructs the VAE; called once, its parameters and persistent buffers sent to
            `meta` as they are registered (see `build_on_meta`).
        checkpoint_path: a `.safetensors` file, a shard index, or a folder holding either.
        device: the target device (cpu or cuda).
        component: the pipeline component name, used in messages and the report.
        config: the component's config (refusals only: quantization, auto_map).
        quantization: a requested quantization; direct loading refuses any.
        decode_dtype: hold the decoder in this dtype through the VAE's prepare hook.
        channels_last_3d: store Conv3d weights in channels_last_3d.

    Returns:
        The loaded module (in eval mode), and a report with one "streamed" record per tensor.

    Raises:
        ComponentCheckpointUnsupportedError: VAE-12 refusals, before anything is built.
        CheckpointError: unreadable files or a disagreeing shard index.
        StateDictABIError: a non-standard state-dict ABI, tied state, or non-persistent
            buffers on meta that no hook rebuilds (before any tensor data is read).
        StateMismatchError: unknown, missing or wrong-shape tensors, before any data is read.
        ArgumentError: a decode dtype the VAE cannot hold.
    """
    start = time.perf_counter()
    refuse_unsupported_config(component, config, quantization)
    checkpoint = open_checkpoint(checkpoint_path)
    refuse_quantized_metadata(component, checkpoint.file_metadata)
    module = build_on_meta(build, component=component)
    refuse_unrebuildable_buffers(module, component=component)
    if decode_dtype is not None:
        require_decode_dtype_support(module, decode_dtype, component=component)
    slots = state_slots(module, component=component)
    plan = preflight(checkpoint, slots, component=component)
    reader = StreamingReader(checkpoint)
    try:
        records, filled = stream(reader, slots, plan, device=device)
    finally:
        reader.close()
    buffers = rebuild_non_persistent_buffers(module, device=device, component=component)
    check_state_kept(module, filled, component=component)
    policy = apply_vae_policy(
        module, channels_last_3d=channels_last_3d, decode_dtype=decode_dtype, component=component
    )
    events = ("build on meta", "preflight", "stream", f"{len(buffers)} buffers rebuilt", *policy)
    load_plan = WeightLoadPlan(
        checkpoint_load_device=device, load_full_state_dict_on_device=device.type != "cpu"
    )
    # In eval mode, as diffusers' from_pretrained returns a model.
    module.eval()
    return module, LoadReport(component, load_plan, records, time.perf_counter() - start, events)
