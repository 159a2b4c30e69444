"""The ordinary load: fill a meta build of the module (a pipeline's checks made it, or the load of
a component alone) or build it for real, copy its checkpoint into it, place it.

No direct-loading feature is involved (ADM-6): this is how a vocoder loads, and a VAE when no
direct request for it was admitted. Names and shapes are checked against the headers before any
tensor data is read.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from reference.errors import LISTED, StateMismatchError, listed, shown
from reference.place.cast import cast_slots
from reference.place.host_memory import construction_guard
from reference.place.materialise import materialise_slots, meta_leftovers
from reference.place.records import TensorRecord
from reference.read.checkpoint import Checkpoint, TensorReader, open_checkpoint
from reference.request.model_index import ComponentSpec

__all__ = ["build_for_real", "load_ordinarily", "load_state_ordinarily"]


def load_ordinarily(
    spec: ComponentSpec,
    *,
    build: Callable[[], nn.Module],
    dtype: torch.dtype,
    device: torch.device,
    target: torch.device | str,
    prebuilt: nn.Module | None = None,
) -> tuple[nn.Module, list[TensorRecord]]:
    """Build the module with `build`, give its slots precision `dtype`, copy its checkpoint into
    it on `device` (the plan's load device), then move it to `target` (CPU when the component is
    offloaded, else the runtime device).

    With `prebuilt` (the same build on meta, `reference.place.build.build_on_meta`, as a
    pipeline's checks or `reference.load.loaders.ordinarily` made it, checked against the
    headers), its slots are given fresh memory instead and the checkpoint is
    loaded into them the same way (`reference.place.materialise`): the same state, without
    initialising what the checkpoint overwrites. Where it holds a meta tensor outside its slots
    (`meta_leftovers`), `build` runs all the same.

    The module comes back as diffusers' `from_pretrained` gives it: in eval mode, each
    parameter's `requires_grad` as construction set it (VAE-10's rule for the streamed path).

    Raises:
        CheckpointError, StateMismatchError, HostMemoryError: as the steps raise them.
    """
    checkpoint = open_checkpoint(spec.folder)
    module = _made_real(prebuilt, dtype) if prebuilt is not None else None
    if module is None:
        module = build_for_real(spec, build, checkpoint)
        cast_slots(module, dtype)  # PREC-1, PREC-2: the real slots, converted before loading
    records = load_state_ordinarily(module, spec, device, checkpoint)
    return module.to(target).eval(), records


def build_for_real(
    spec: ComponentSpec, build: Callable[[], nn.Module], checkpoint: Checkpoint
) -> nn.Module:
    """`build()`, the ordinary way's real build, within the host memory `checkpoint` explains.

    Raises:
        HostMemoryError: the build would take more (naming the config key that sized it).
    """
    # Weights within WIDEST_RATIO of the checkpoint, tables within TABLE_FLOOR (a config.json
    # sized past its weights).
    with construction_guard(
        spec.name, checkpoint_bytes=checkpoint.total_bytes, ordinary=True, config=spec.init_kwargs
    ):
        return build()


def _made_real(prebuilt: nn.Module, dtype: torch.dtype) -> nn.Module | None:
    """`prebuilt` (on meta) with its slots in `dtype` (PREC-1, PREC-2) and in fresh host
    memory; None, with nothing allocated, where that would leave a meta tensor in it."""
    slots = cast_slots(prebuilt, dtype)
    if meta_leftovers(prebuilt, slots):
        return None
    materialise_slots(slots)
    return prebuilt


def _names(names: list[str]) -> str:
    return f"[{listed(names)}]" if names else "none"


def load_state_ordinarily(
    module: nn.Module, component: ComponentSpec, device: torch.device, checkpoint: Checkpoint
) -> list[TensorRecord]:
    """The ordinary path: read each tensor onto `device` and copy it into the module's state.

    Names and shapes are checked against the headers before any tensor data is read, so a
    failure of torch's own copy afterwards is not a mismatch (the caller wraps it).

    Raises:
        CheckpointError: for unreadable weights.
        StateMismatchError: listing missing and unexpected names, or each wrong shape.
    """
    expected = module.state_dict()
    missing = sorted(set(expected) - set(checkpoint.tensors))
    unexpected = sorted(set(checkpoint.tensors) - set(expected))
    wrong = [
        f"'{shown(name)}' is {list(info.shape)} in {shown(info.file.name)}, the module expects"
        f" {list(expected[name].shape)}"
        for name, info in sorted(checkpoint.tensors.items())
        if name in expected and info.shape != tuple(expected[name].shape)
    ]
    if missing or unexpected or wrong:
        more = f" and {len(wrong) - LISTED} more" if len(wrong) > LISTED else ""
        raise StateMismatchError(
            f"component {component.name!r}: checkpoint in {shown(component.folder)} does not"
            f" match {type(module).__name__}; missing: {_names(missing)}; unexpected:"
            f" {_names(unexpected)}; wrong shapes:"
            f" {'; '.join(wrong[:LISTED]) + more or 'none'}"
        )
    reader = TensorReader(checkpoint)
    try:
        state = {name: reader.read(name, device=device) for name in reader}
        module.load_state_dict(state, strict=True)
    finally:
        reader.close()
    return [
        TensorRecord(
            name,
            "copied",
            expected[name].numel() * expected[name].element_size(),
            converted_from=t.dtype if t.dtype != expected[name].dtype else None,
            dtype=expected[name].dtype,
        )
        for name, t in state.items()
    ]
