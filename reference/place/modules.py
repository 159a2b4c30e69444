"""The one home of `nn.Module` introspection: the walk, the slots, the meta build, buffers.

Both component loaders (`reference.load.dit`, `reference.load.vae`) build their module here and ask
it the same questions, so neither imports the other:
  * `walk` is the only loop over a module's parameters and buffers (every path, ties included);
  * a `Slot` is one assignable entry (a parameter or a persistent buffer) under all its names;
    `find_slots` groups the walk into slots and the alias names of tied entries;
  * `build_on_meta` constructs a module with its parameters and persistent buffers on `meta`
    while its non-persistent buffers keep the real values construction computes (VAE-1, VAE-9);
  * `refuse_unrebuildable_buffers` and `rebuild_non_persistent_buffers` give the non-persistent
    buffers their values after a load, or refuse before one (VAE-9).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

from reference.errors import StateDictABIError
from reference.place.host_memory import allocation_guard, release

__all__ = [
    "REBUILD_HOOK",
    "Entry",
    "Slot",
    "Slots",
    "build_on_meta",
    "find_slots",
    "has_method",
    "non_persistent_buffers",
    "rebuild_non_persistent_buffers",
    "refuse_unrebuildable_buffers",
    "state_entries",
    "submodules",
    "walk",
]

REBUILD_HOOK = "rebuild_buffers"
_REGISTER_BUFFER = nn.Module.register_buffer.__code__
# torch.utils.swap_tensors ends with this; where a torch lacks it (or the use count it checks
# first), swap_tensors itself is used.
_SWAP_IMPL: Callable[[torch.Tensor, torch.Tensor], None] | None = (
    getattr(torch._C, "_swap_tensor_impl", None) if hasattr(torch.Tensor, "_use_count") else None
)


@dataclass(frozen=True, eq=False)
class Entry:
    """One tensor of a module under one of its names.

    Attributes:
        key: the full name (`decoder.conv_in.weight`).
        owner: the submodule that holds it; `attr` is its name there (`weight`).
        tensor: the tensor itself.
        is_parameter: a parameter (else a buffer).
        persistent: saved in the state dict (every parameter; buffers unless registered
            with `persistent=False`).
    """

    key: str
    owner: nn.Module
    attr: str
    tensor: torch.Tensor
    is_parameter: bool
    persistent: bool


def submodules(module: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`module.named_modules(remove_duplicate=False)`: every submodule under every path, the
    module itself first, in registration order (pre-order).

    One loop over a stack instead of torch's generator per level: a load walks its module
    several times, and each name of a deep module passed through one generator per level
    (measured on a 231-tensor Wan DiT: the seven walks of a zero-copy load took 1.3 ms of its
    25 ms that way).
    """
    stack = [("", module)]
    while stack:
        path, sub = stack.pop()
        yield path, sub
        prefix = f"{path}." if path else ""
        children = [
            (prefix + name, child) for name, child in sub._modules.items() if child is not None
        ]
        stack.extend(reversed(children))


def walk(module: nn.Module, *, persistent: bool | None = None) -> Iterator[Entry]:
    """Every parameter and buffer of `module` under every name it has, in registration order;
    only the persistent ones (parameters and persistent buffers) or only the non-persistent
    buffers where `persistent` says so.

    Nothing is deduplicated: a submodule registered under two paths contributes its entries
    once per path, and a tensor registered under two names appears under each.
    """
    for path, sub in submodules(module):
        prefix = f"{path}." if path else ""
        if persistent is not False:
            for attr, param in sub._parameters.items():
                if param is not None:
                    yield Entry(prefix + attr, sub, attr, param, True, True)
        for attr, buf in sub._buffers.items():
            kept = attr not in sub._non_persistent_buffers_set
            # Asked before an Entry is made: a load walks its module several times.
            if buf is not None and persistent in (None, kept):
                yield Entry(prefix + attr, sub, attr, buf, False, kept)


def state_entries(module: nn.Module) -> list[Entry]:
    """The entries a state dict holds: parameters and persistent buffers, every name."""
    return list(walk(module, persistent=True))


def non_persistent_buffers(module: nn.Module) -> dict[str, Entry]:
    """Every non-persistent buffer of `module` by full name (no checkpoint holds them)."""
    return {entry.key: entry for entry in walk(module, persistent=False)}


@dataclass(frozen=True, eq=False)
class Slot:
    """One assignable entry of a module: a parameter or a persistent buffer, under all its names.

    Attributes:
        name: its first state-dict key.
        tensor: the tensor as built (on meta its shape and dtype are known without any data).
        places: every (owner, attribute) that holds it; more than one when it is tied.
        is_parameter: a parameter (else a persistent buffer).
    """

    name: str
    tensor: torch.Tensor
    places: tuple[tuple[nn.Module, str], ...]
    is_parameter: bool

    @property
    def owner(self) -> nn.Module:
        return self.places[0][0]

    @property
    def attr(self) -> str:
        return self.places[0][1]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def requires_grad(self) -> bool:
        """The parameter's flag as built (False for buffers)."""
        return self.is_parameter and bool(self.tensor.requires_grad)


@dataclass(frozen=True)
class Slots:
    """A module's slots by first name, and each tied alias name mapped to that first name."""

    by_name: Mapping[str, Slot]
    aliases: Mapping[str, str]


def find_slots(module: nn.Module) -> Slots:
    """Group the module's state entries into slots: one per tensor, however many names it has."""
    names: dict[int, str] = {}
    places: dict[int, list[tuple[nn.Module, str]]] = {}
    entries: dict[int, Entry] = {}
    aliases: dict[str, str] = {}
    for entry in state_entries(module):
        key = id(entry.tensor)
        first = names.setdefault(key, entry.key)
        entries.setdefault(key, entry)
        held = places.setdefault(key, [])
        if all(o is not entry.owner or a != entry.attr for o, a in held):
            held.append((entry.owner, entry.attr))
        if first != entry.key:
            aliases[entry.key] = first
    slots = {
        names[key]: Slot(names[key], entry.tensor, tuple(places[key]), entry.is_parameter)
        for key, entry in entries.items()
    }
    return Slots(slots, aliases)


def _initialised() -> None:
    """A standard layer's `reset_parameters` during a meta build (see `_Build.quiet`)."""


# torch layers whose reset_parameters initialises their own parameters and nothing else.
_INITIALISES_PARAMETERS_ONLY = frozenset(
    {
        nn.Linear,
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.ConvTranspose1d,
        nn.ConvTranspose2d,
        nn.ConvTranspose3d,
        nn.Embedding,
        nn.LayerNorm,
        nn.GroupNorm,
        *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()),
    }
)


class _Build:
    """One meta build's state: the tensors sent to meta (by id: the original, then its meta
    tensor), and the standard layers whose initialisation is skipped."""

    def __init__(self) -> None:
        self.memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._quieted: list[nn.Module] = []

    def quiet(self, module: nn.Module) -> None:
        """Skip `module`'s `reset_parameters` until the build ends.

        Only for the torch layers of `_INITIALISES_PARAMETERS_ONLY`, whose parameters are all
        on meta by the time their constructor initialises them: initialising a meta tensor
        changes nothing, yet costs torch's Python initialisers and a trip through the
        allocation guard's handler for every tensor call they make (measured: 1.8 ms of the
        13 ms build of a 231-tensor Wan DiT). The method is shadowed on the instance, never on
        the class, so a layer built at the same moment in another thread initialises as usual.
        """
        if "reset_parameters" not in module.__dict__:
            module.__dict__["reset_parameters"] = _initialised  # an instance's: not bound
            self._quieted.append(module)

    def restore(self) -> None:
        """Give every quieted layer its own `reset_parameters` back."""
        for module in self._quieted:
            module.__dict__.pop("reset_parameters", None)
        self._quieted.clear()


class _MetaBuild:
    """Sends parameters and persistent buffers to `meta` as a module registers them, in the
    building thread only.

    torch's own registration hooks do it (no torch function is replaced); they act only in a
    context (thread) that is building, so a module constructed in another thread at the same
    moment is built as usual. Everything else that construction computes (non-persistent
    buffers: frequency tables, wavelet filters, index ranges) keeps its real values (VAE-9).
    This is accelerate's `init_empty_weights(include_buffers=False)`, which diffusers' own
    low-memory load uses (so every diffusers class builds under it), with persistent buffers
    on meta too: the checkpoint fills them. One tensor registered under two names stays one
    tensor (ties are kept for VAE-6).
    """

    active: ContextVar[_Build | None] = ContextVar("meta_build", default=None)
    lock = threading.Lock()
    users = 0
    hooks: tuple[RemovableHandle, ...] = ()

    @classmethod
    def to_meta(cls, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` on meta (same class, attributes, requires_grad), once per tensor."""
        build = cls.active.get()
        if build is None:
            return tensor
        memo = build.memo
        # Outside every torch function mode, the allocation guard's included: this is the
        # build's own bookkeeping, a dozen tensor calls per parameter, none an allocation on
        # the CPU, and each would cost a trip through the modes' Python handlers.
        with torch._C.DisableTorchFunction():
            if tensor.is_meta or is_lazy(tensor):
                return tensor
            seen = memo.get(id(tensor))
            if seen is None:
                seen = memo[id(tensor)] = cls._swap_to_meta(tensor)
            return seen[1]

    @staticmethod
    def _swap_to_meta(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        release(tensor)  # its real bytes are about to go
        meta = torch.Tensor._make_subclass(
            type(tensor), tensor.detach().to("meta"), tensor.requires_grad
        )
        # In place: the caller's object itself goes to meta, so attributes it sets on that
        # object after registering it (a layer's `weight_loader`) are kept.
        if (
            _SWAP_IMPL is not None
            and tensor._use_count() == 1  # type: ignore[attr-defined]
            and not tensor.is_inference()
        ):
            # Nothing else holds its data (no view, no autograd node): swapping the two
            # objects' data alone is what swap_tensors ends with, without its checks for the
            # cases just ruled out, and the real bytes go with `meta` at once.
            _SWAP_IMPL(tensor, meta)
            return tensor, tensor
        meta.__dict__.update(tensor.__dict__)
        try:
            torch.utils.swap_tensors(tensor, meta)  # type: ignore[no-untyped-call]
            tensor, meta = meta, tensor
        except RuntimeError:  # a view or weakly referenced tensor: register the meta copy
            pass
        # The original is kept so that its id is not reused while the build runs.
        return tensor, meta

    @classmethod
    def on_parameter(cls, module: nn.Module, name: str, param: nn.Parameter) -> torch.Tensor:
        build = cls.active.get()
        if build is not None and type(module) in _INITIALISES_PARAMETERS_ONLY:
            build.quiet(module)
        return cls.to_meta(param)

    @classmethod
    def on_buffer(cls, module: nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # torch's buffer hook is not told whether the buffer is persistent; the registering
        # call's own argument is. Where that call is not torch's register_buffer (another torch
        # version), the buffer stays real here and `settle` sends it to meta if persistent.
        caller = sys._getframe(1)
        if caller.f_code is not _REGISTER_BUFFER or not caller.f_locals.get("persistent", True):
            return tensor
        return cls.to_meta(tensor)

    @classmethod
    @contextmanager
    def building(cls) -> Iterator[None]:
        with cls.lock:
            if cls.users == 0:
                cls.hooks = (
                    register_module_parameter_registration_hook(cls.on_parameter),  # type: ignore[arg-type]
                    register_module_buffer_registration_hook(cls.on_buffer),  # type: ignore[arg-type]
                )
            cls.users += 1
        build = _Build()
        token = cls.active.set(build)
        try:
            yield
        finally:
            cls.active.reset(token)
            build.restore()
            with cls.lock:
                cls.users -= 1
                if cls.users == 0:
                    for hook in cls.hooks:
                        hook.remove()

    @classmethod
    def settle(cls, module: nn.Module) -> None:
        """Send to meta, in a build, what bypassed registration (a tensor assigned over an
        existing buffer, or written into `_parameters` directly), keeping ties."""
        with torch._C.DisableTorchFunction():  # bookkeeping, as in `to_meta`
            for entry in list(walk(module, persistent=True)):
                if not entry.tensor.is_meta:
                    store = entry.owner._parameters if entry.is_parameter else entry.owner._buffers
                    store[entry.attr] = cls.to_meta(entry.tensor)  # type: ignore[assignment]


def build_on_meta(build: Callable[[], nn.Module], *, component: str) -> nn.Module:
    """VAE-1, VAE-9: run `build()` with every parameter and persistent buffer on `meta`.

    No parameter or persistent buffer storage is kept (each is sent to meta as it is
    registered); non-persistent buffers are computed as an ordinary construction computes them,
    so they hold their real values. Safe to call from several threads at once: each build is
    seen only by its own thread, and torch itself is not changed. Every CPU allocation of the
    construction is checked against the host's available memory first
    (`reference.place.host_memory.allocation_guard`).

    Raises:
        StateDictABIError: `build` did not return an `nn.Module`.
        HostMemoryError: the construction would take more host memory than is available.
    """
    with _MetaBuild.building(), allocation_guard(component):
        module = build()
        if not isinstance(module, nn.Module):
            raise StateDictABIError(
                f"{component}: build() returned {type(module).__name__}, not an nn.Module;"
                " pass the model class or a function that constructs it"
            )
        _MetaBuild.settle(module)
    return module


def has_method(module: nn.Module, name: str) -> bool:
    # Looked up on the class: a submodule registered under that name is not a hook.
    return callable(getattr(type(module), name, None))


def refuse_unrebuildable_buffers(module: nn.Module, *, component: str) -> tuple[str, ...]:
    """VAE-9: right after the meta build, refuse buffers that nothing will give a value.

    A non-persistent buffer on `meta` is acceptable only when the submodule that owns it has a
    `rebuild_buffers(device)` method; checked before any tensor data is read.

    Returns:
        The names of the non-persistent buffers the hooks will rebuild.

    Raises:
        StateDictABIError: naming every buffer on meta whose owner has no such method.
    """
    on_meta = {
        name: entry.owner
        for name, entry in non_persistent_buffers(module).items()
        if entry.tensor.is_meta
    }
    orphans = sorted(name for name, sub in on_meta.items() if not has_method(sub, REBUILD_HOOK))
    if orphans:
        raise StateDictABIError(
            f"{component}: non-persistent buffers {', '.join(orphans)} are on meta after the"
            " meta build: construction made them from meta tensors, no checkpoint holds them,"
            f" and their submodules have no {REBUILD_HOOK}(device) method to recompute them."
            f" Drop the direct-loading flag for {component}, or give the owning submodule a"
            f" {REBUILD_HOOK}(device) method"
        )
    return tuple(sorted(on_meta))


def rebuild_non_persistent_buffers(
    module: nn.Module, *, device: torch.device, component: str
) -> tuple[str, ...]:
    """VAE-9: give every non-persistent buffer its constructed value on `device`, or fail.

    Calls `rebuild_buffers(device)` on each submodule that defines it, then moves the
    non-persistent buffers (real since construction, or rebuilt) to `device`.

    Returns:
        The names of the non-persistent buffers, all real and on `device`.

    Raises:
        StateDictABIError: naming the buffers still on meta.
    """
    for sub in module.modules():
        if has_method(sub, REBUILD_HOOK):
            getattr(sub, REBUILD_HOOK)(device)
    buffers = non_persistent_buffers(module)
    on_meta = sorted(name for name, entry in buffers.items() if entry.tensor.is_meta)
    if on_meta:
        raise StateDictABIError(
            f"{component}: non-persistent buffers {', '.join(on_meta)} are still on meta after"
            f" the {REBUILD_HOOK}(device) methods ran; no checkpoint holds them. Make the"
            f" method recompute every buffer it owns, or drop the direct-loading flag for"
            f" {component}"
        )
    for entry in buffers.values():
        # Read again: under a second path the owner's buffer may have moved already.
        entry.owner._buffers[entry.attr] = entry.owner._buffers[entry.attr].to(device)  # type: ignore[union-attr]
    return tuple(buffers)
