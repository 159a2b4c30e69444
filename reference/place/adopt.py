"""Zero-copy adoption and the full-state load of a module built on `meta` (ZC-1..12, DG-5).

A checkpoint tensor may *become* a parameter's storage only when a TP=1 linear loader would do
nothing but copy it (ZC-1..8), or when the parameter has no `weight_loader` at all and the tensor
already fits it (ZC-2b: plain torch layers, every diffusers model). Every other tensor goes
through a fresh tensor on the checkpoint load device, filled by the layer's own `weight_loader`
(which shards for TP>1), or converted once when the parameter has none. The predicate's verdict
carries the first failing condition, which the load report keeps as the reason of each copy
(ZC-14).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from types import MethodType
from typing import Protocol

import torch
from torch import nn

from reference.errors import StateMismatchError
from reference.place.host_memory import COPY_FIX, refuse_beyond_host, slot_bytes
from reference.place.modules import Slot, Slots, find_slots
from reference.place.records import How, TensorRecord

__all__ = [
    "ADOPT",
    "ADOPTION_DISABLED",
    "BUFFER_COPIED",
    "REFERENCE_ADOPT_STEPS",
    "AdoptSteps",
    "AdoptedBytes",
    "LinearKinds",
    "Verdict",
    "copy_to_fresh",
    "keep_fresh",
    "keeps_read_tensor",
    "load_full_state",
    "same_device",
    "zero_copy_verdict",
]

CPU = torch.device("cpu")
# Parameters carrying one of these flags need more than a copy (ZC-7).
SPECIAL_FLAGS = ("is_metadata", "is_sharded_weight", "needs_scalar_to_array")


@dataclass(frozen=True)
class LinearKinds:
    """Which classes are the serving stack's standard linears and its unquantized method.

    The reference knows no layer library; the caller names them. Subclasses of the three layers
    count as standard owners, as long as they do not override `weight_loader` (ZC-3).
    """

    replicated: type[nn.Module]
    column_parallel: type[nn.Module]
    row_parallel: type[nn.Module]
    unquantized_method: type

    @property
    def layers(self) -> tuple[type[nn.Module], ...]:
        return (self.replicated, self.column_parallel, self.row_parallel)


@dataclass(frozen=True)
class Verdict:
    """Adopt the checkpoint tensor, or copy it; `reason` is the first failing condition."""

    adopt: bool
    reason: str | None = None


ADOPT = Verdict(True)
# The reason a tensor is copied when the caller turned adoption off (the benchmark's copy path).
ADOPTION_DISABLED = "adoption disabled by the caller"
# Persistent buffers are copied: ZC-2b speaks of parameters, and a buffer is small.
BUFFER_COPIED = "ZC-11: a persistent buffer, not a parameter: copied"


def same_device(a: torch.device, b: torch.device) -> bool:
    """Devices equal, where a device without an index matches any index of its type."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _shape_and_layout(
    tensor: torch.Tensor, target: torch.Tensor, *, plain: bool = False
) -> str | None:
    """ZC-8 (ZC-2b's conversion and ZC-2c's layout for a parameter without weight_loader)."""
    fit, layout = ("ZC-2b", "ZC-2c") if plain else ("ZC-8", "ZC-8")
    if tensor.shape != target.shape:
        return f"{fit}: shape {tuple(tensor.shape)} != target {tuple(target.shape)}"
    if tensor.dtype != target.dtype:
        return f"{fit}: dtype {tensor.dtype} != target {target.dtype}: converted once"
    if tensor.layout != target.layout:
        return f"{layout}: layout {tensor.layout} != target {target.layout}"
    if tensor.stride() != target.stride():
        return f"{layout}: strides {tensor.stride()} != target {target.stride()}"
    return None


def _refusal(
    param: torch.Tensor,
    checkpoint_tensor: torch.Tensor,
    target: torch.Tensor,
    kinds: LinearKinds,
    direct_device: torch.device | None,
) -> str | None:
    where = checkpoint_tensor.device
    loader = param.__dict__.get("weight_loader")
    if loader is None:
        # A plain-torch parameter takes its tensor directly in any mode (ZC-2b): converted
        # once where its device or dtype differs from the target's, else adopted, provided it
        # is a plain Parameter with no special flag and the layout fits (ZC-2c).
        if direct_device is not None and not same_device(where, direct_device):
            return f"ZC-2b: checkpoint tensor is on {where}, not the load device {direct_device}"
        return _plain_refusal(param, "ZC-2c") or _shape_and_layout(
            checkpoint_tensor, target, plain=True
        )
    if direct_device is None and where.type != "cpu":
        return f"ZC-1: checkpoint tensor is on {where}, not cpu"
    if direct_device is not None and not same_device(where, direct_device):
        return f"DG-5: checkpoint tensor is on {where}, not the load device {direct_device}"
    if not isinstance(loader, MethodType):
        return f"ZC-2: weight_loader is a {type(loader).__name__}, not a bound method"
    owner = loader.__self__
    if not isinstance(owner, kinds.layers):
        return (
            f"ZC-3: weight_loader belongs to {type(owner).__name__}, not a replicated,"
            " column- or row-parallel linear"
        )
    if loader.__func__ not in [getattr(layer, "weight_loader", None) for layer in kinds.layers]:
        return f"ZC-3: {loader.__func__.__qualname__} is not a standard linear's own weight_loader"
    method = getattr(owner, "quant_method", None)
    if not isinstance(method, kinds.unquantized_method):
        return (
            f"ZC-4: quant method is {type(method).__name__},"
            f" not {kinds.unquantized_method.__name__}"
        )
    if not isinstance(owner, kinds.replicated):
        tp_size = getattr(owner, "tp_size", None)  # read now: it may change after construction
        if tp_size != 1:
            return f"ZC-5: tp_size is {tp_size}"
    return _plain_refusal(param) or _shape_and_layout(checkpoint_tensor, target)


def _plain_refusal(param: torch.Tensor, rule: str | None = None) -> str | None:
    """ZC-6, ZC-7 (both ZC-2c's for a parameter without weight_loader, given as `rule`)."""
    if type(param) is not nn.Parameter:
        return f"{rule or 'ZC-6'}: parameter type is {type(param).__name__}, not Parameter"
    attributes = param.__dict__
    if not attributes:  # most parameters carry none
        return None
    for flag in SPECIAL_FLAGS:
        if attributes.get(flag, False):
            return f"{rule or 'ZC-7'}: parameter flag {flag} is set"
    return None


def zero_copy_verdict(
    param: torch.Tensor,
    checkpoint_tensor: torch.Tensor,
    target: torch.Tensor,
    *,
    kinds: LinearKinds,
    direct_device: torch.device | None = None,
) -> Verdict:
    """Whether `checkpoint_tensor` may become `param`'s storage without a copy (ZC-1..8, DG-5).

    Args:
        param: the module's parameter (it carries `weight_loader` and the flags).
        checkpoint_tensor: the tensor read from the checkpoint.
        target: the tensor the slot must hold (shape, dtype, layout, strides); usually `param`.
        kinds: the standard linear classes and the unquantized method.
        direct_device: None for the ordinary rule (the tensor must be on CPU, ZC-1); in direct
            mode the load device, where the tensor must be instead (DG-5).

    A parameter without `weight_loader` (plain torch: `nn.Linear`, norms, embeddings) is judged
    by ZC-2b and ZC-2c alone (ZC-1..8 are about the layer that would copy it): adopted in any
    mode when it is exactly `nn.Parameter`, carries no special flag, and the tensor has its
    shape, dtype, layout and strides (and, in direct mode, sits on the load device).

    Returns:
        ADOPT, or a copy verdict whose reason starts with the first failing rule ID.
    """
    reason = _refusal(param, checkpoint_tensor, target, kinds, direct_device)
    return ADOPT if reason is None else Verdict(False, reason)


class AdoptedBytes:
    """The byte ranges adopted so far, per memory space, to refuse adopting bytes twice (ZC-12).

    Ranges are absolute addresses per device, so views of one file mapping that do not overlap
    are told apart from views that do. Meta tensors have no memory: there, a storage is its own
    space. Adopted ranges never overlap, so sorted by start only one neighbour needs checking.
    """

    def __init__(self) -> None:
        self._spaces: dict[tuple[str, int | None], list[tuple[int, int, str]]] = {}

    @staticmethod
    def _locate(tensor: torch.Tensor) -> tuple[tuple[str, int | None], int, int]:
        device = tensor.device
        if device.type != "meta":
            start = tensor.data_ptr()  # the storage's address plus the tensor's offset
            return (device.type, device.index), start, start + tensor.nbytes
        storage = tensor.untyped_storage()
        start = int(tensor.storage_offset()) * tensor.element_size()
        return ("meta", storage._cdata), start, start + tensor.nbytes

    def clash(self, tensor: torch.Tensor) -> str | None:
        """The name of an adopted tensor sharing bytes with `tensor`, or None."""
        space, start, end = self._locate(tensor)
        ranges = self._spaces.get(space, [])
        before = bisect.bisect_left(ranges, (end,))  # ranges starting before `end`
        if start < end and before and ranges[before - 1][1] > start:
            return ranges[before - 1][2]
        return None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        space, start, end = self._locate(tensor)
        bisect.insort(self._spaces.setdefault(space, []), (start, end, name))


def _like(param: torch.Tensor, data: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    """A parameter of `param`'s class over `data`, carrying `param`'s instance attributes."""
    new = torch.Tensor._make_subclass(type(param), data, requires_grad)
    new.__dict__.update(param.__dict__)
    return new


def copy_to_fresh(slot: Slot, tensor: torch.Tensor, load_device: torch.device) -> torch.Tensor:
    """The copy path: a fresh tensor on `load_device` for `slot`, filled by the layer's own
    `weight_loader` (which shards for TP>1) or, without one, converted once (ZC-10, ZC-11).

    Raises:
        StateMismatchError: a wrong shape, or a failure inside the weight_loader.
    """
    target = slot.tensor
    # Same tensor as empty_like; but empty_like of a meta tensor onto another device runs a
    # Python reference that imports sympy (about a second and 30 MiB, once per process).
    fresh = (
        torch.empty(target.shape, dtype=target.dtype, device=load_device)
        if target.is_contiguous()
        else torch.empty_like(target, device=load_device)
    )
    loader = target.__dict__.get("weight_loader")
    if loader is None or not slot.is_parameter:
        if tensor.shape != target.shape:
            raise StateMismatchError(
                f"{slot.name}: checkpoint shape {tuple(tensor.shape)} != slot shape"
                f" {tuple(target.shape)}; the checkpoint does not fit this model"
            )
        fresh.copy_(tensor)  # converts the dtype here, once
        if not slot.is_parameter:
            return fresh
    grad = target.requires_grad and (fresh.is_floating_point() or fresh.is_complex())
    temp = _like(target, fresh, grad)
    if loader is None:
        return temp
    try:
        loader(temp, tensor)  # the layer's own loader: shards for TP>1, converts the dtype once
    except torch.OutOfMemoryError:
        raise
    except (AssertionError, IndexError, RuntimeError) as exc:  # shape checks, narrow, copy_
        raise StateMismatchError(
            f"{slot.name}: weight_loader failed: checkpoint shape {tuple(tensor.shape)},"
            f" target shape {tuple(target.shape)}, temporary shape {tuple(temp.shape)},"
            f" parameter class {type(target).__name__} ({exc})"
        ) from exc
    return temp


def keeps_read_tensor(
    slot: Slot, dtype: torch.dtype, shape: tuple[int, ...], load_device: torch.device
) -> bool:
    """Whether the copy path would only copy a CPU tensor of `dtype` and `shape` into an
    identical new tensor for `slot`, so that a fresh tensor read for it can be kept instead:
    a CPU load device, no `weight_loader` (a parameter with one is filled by it), the slot's
    shape and dtype, a contiguous slot. Answerable from a header, before any byte is read."""
    target = slot.tensor
    if load_device.type != "cpu":
        return False
    if slot.is_parameter and target.__dict__.get("weight_loader") is not None:
        return False
    return tuple(shape) == tuple(target.shape) and dtype == target.dtype and target.is_contiguous()


def keep_fresh(
    slot: Slot, tensor: torch.Tensor, load_device: torch.device, *, as_is: bool = False
) -> torch.Tensor | None:
    """The copy path without its copy, for a tensor its reader freshly allocated (never a view
    of a file map): `tensor` itself as the slot's tensor where `keeps_read_tensor` allows it,
    or where `as_is` says the layer's own loader would copy it unchanged (the zero-copy verdict
    holds for it: a standard loader at TP=1, unquantized, the slot's dtype and layout), else
    None (the copy path must run). A parameter keeps its class and attributes, and gets the
    `requires_grad` the copy path gives it (ZC-10, ZC-11)."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or load_device.type != "cpu":
        return None
    if not as_is and not keeps_read_tensor(slot, tensor.dtype, tuple(tensor.shape), load_device):
        return None
    if not slot.is_parameter:
        return tensor
    target = slot.tensor
    grad = target.requires_grad and (tensor.is_floating_point() or tensor.is_complex())
    return _like(target, tensor, grad)


CopyStep = Callable[[Slot, torch.Tensor, torch.device], torch.Tensor]


class VerdictStep(Protocol):
    def __call__(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict: ...


@dataclass(frozen=True)
class AdoptSteps:
    """The steps of `load_full_state` a caller may replace, each with the reference's default:
    the zero-copy predicate, the copy path, and the ledger of adopted bytes (ZC-12). A loader
    that differs in one step passes its own (the conformance kit's broken loaders do)."""

    verdict: VerdictStep = zero_copy_verdict
    copy: CopyStep = copy_to_fresh
    ledger: Callable[[], AdoptedBytes] = AdoptedBytes


REFERENCE_ADOPT_STEPS = AdoptSteps()


@torch.no_grad()
def load_full_state(
    module: nn.Module,
    tensors: Iterable[tuple[str, torch.Tensor]],
    *,
    load_device: torch.device,
    kinds: LinearKinds,
    direct: bool = False,
    adopt: bool = True,
    fresh: Collection[str] = frozenset(),
    steps: AdoptSteps = REFERENCE_ADOPT_STEPS,
    host_bytes: int | None = None,
    component: str = "the module",
    map_views: bool = False,
    slots: Slots | None = None,
) -> tuple[TensorRecord, ...]:
    """Give every slot of `module` (built on `meta`) its tensor: adopted or freshly copied.

    Tensors are taken one at a time and materialised on `load_device` first. An eligible tensor
    (ZC-1..8; in direct mode ZC-2..8 on the load device) becomes the parameter itself, keeping the
    parameter's attributes, with requires_grad=False (ZC-9); a second adoption of bytes already
    adopted is refused (ZC-12). Slots are assigned only once every tensor loaded, so a failure
    leaves `module` untouched. Tied parameters stay tied; their alias names are skipped.
    With `adopt=False` every tensor takes the copy path (the record's reason says so); that is
    the benchmark's copy path, not a contract mode. `fresh` names the tensors that are fresh
    allocations of their own (a `PooledReader`'s): a copied one the slot could hold as is is
    kept instead of copied a second time (`keep_fresh`). `steps` replaces the predicate, the copy
    path or the ledger (see `AdoptSteps`). With `host_bytes` (the host memory available) and a
    CPU load device, a copy that would take the copies past it is refused before it allocates.
    With `map_views` (the tensors not in `fresh` are views of a file's private map, as a
    `TensorReader` reads them), direct mode onto the CPU adopts host memory of the tensor's own,
    never the file's map (PLAN-3): such a tensor the verdict adopts is copied once first.
    `slots`: `module`'s slots (`find_slots`) where the caller has them already.

    Returns:
        One record per loaded slot, in load order.

    Raises:
        HostMemoryError: a copy would take the copies past `host_bytes`.
        StateMismatchError: for an unknown, repeated or missing name, a wrong shape, or an
            assertion inside a weight_loader (naming the parameter, the three shapes and class).
    """
    found = find_slots(module) if slots is None else slots
    by_name, aliases = found.by_name, found.aliases
    direct_device = load_device if direct else None
    loaded: dict[str, torch.Tensor] = {}
    records: list[TensorRecord] = []
    adopted = steps.ledger()
    copied_bytes = 0
    for name, read in tensors:
        if name in aliases:
            continue
        slot = by_name.get(name)
        if slot is None:
            raise StateMismatchError(
                f"checkpoint tensor {name!r} matches no parameter or persistent buffer of"
                f" {type(module).__name__}"
            )
        if name in loaded:
            raise StateMismatchError(f"checkpoint tensor {name!r} is given twice")
        tensor = read if same_device(read.device, load_device) else read.to(load_device)
        if not adopt:
            verdict = Verdict(False, ADOPTION_DISABLED)
        elif not slot.is_parameter:
            verdict = Verdict(False, BUFFER_COPIED)
        else:
            verdict = steps.verdict(
                slot.tensor, tensor, slot.tensor, kinds=kinds, direct_device=direct_device
            )
        if (
            verdict.adopt
            and map_views
            and direct
            and load_device.type == "cpu"
            and name not in fresh
        ):
            tensor = tensor.clone()
        if verdict.adopt:
            clash = adopted.clash(tensor)
            if clash is not None:
                verdict = Verdict(False, f"ZC-12: bytes already adopted by {clash}")
        if verdict.adopt:
            new = _like(slot.tensor, tensor, False)
            adopted.add(name, tensor)
        else:
            if host_bytes is not None and load_device.type == "cpu":
                copied_bytes += slot_bytes(slot.tensor)
                refuse_beyond_host(
                    component,
                    copied_bytes,
                    available=host_bytes,
                    what=f"copying {name!r} (with the copies before it)",
                    fix=COPY_FIX,
                )
            kept = None
            if name in fresh:
                # The verdict of adoption tells whether the layer's loader would copy the
                # tensor unchanged; a fresh buffer of those bytes can then be kept.
                as_is = slot.is_parameter and (
                    verdict.adopt
                    or steps.verdict(slot.tensor, tensor, slot.tensor, kinds=kinds).adopt
                )
                kept = keep_fresh(slot, tensor, load_device, as_is=as_is)
            new = steps.copy(slot, tensor, load_device) if kept is None else kept
        loaded[name] = new
        how: How = "adopted" if verdict.adopt else "copied"
        converted = tensor.dtype if tensor.dtype != new.dtype else None
        records.append(TensorRecord(name, how, new.nbytes, verdict.reason, converted, new.dtype))
        del read, tensor  # hold at most one transient tensor
    missing = sorted(set(by_name) - set(loaded))
    if missing:
        raise StateMismatchError(
            f"{type(module).__name__}: no checkpoint tensor for {', '.join(missing)}"
        )
    for name, new in loaded.items():
        for owner, leaf in by_name[name].places:
            store = owner._parameters if by_name[name].is_parameter else owner._buffers
            store[leaf] = new  # type: ignore[assignment]
    return tuple(records)
