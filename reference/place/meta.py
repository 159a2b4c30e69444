"""The machinery of a meta build: parameters and persistent buffers sent to `meta` as a module
registers them, in the building thread only (VAE-1, VAE-9). `reference.place.build.build_on_meta`
runs a build under it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

from reference.place.host_memory import factories_on_meta, release
from reference.place.modules import submodules

__all__ = ["SWAP_IMPL", "MetaBuild"]

_REGISTER_BUFFER = nn.Module.register_buffer.__code__
# torch.utils.swap_tensors ends with this; where a torch lacks it (or the use count it checks
# first), swap_tensors itself is used.
SWAP_IMPL: Callable[[torch.Tensor, torch.Tensor], None] | None = (
    getattr(torch._C, "_swap_tensor_impl", None) if hasattr(torch.Tensor, "_use_count") else None
)


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
# Their constructors, and those of the classes between them and nn.Module (a Conv2d's factory
# calls are in _ConvNd.__init__): every factory call these make is one of the layer's parameters.
_LAYER_CONSTRUCTORS = frozenset(
    base.__init__.__code__
    for layer in _INITIALISES_PARAMETERS_ONLY
    for base in layer.__mro__[: layer.__mro__.index(nn.Module)]
    if "__init__" in vars(base)
)


class _Build:
    """One meta build's state: the tensors sent to meta (by id: the original, then its meta
    tensor), the standard layers whose initialisation is skipped, and `mark`, called with the
    module and the meta tensor of each slot it registers (a library's own flag for "nothing to
    initialise here")."""

    def __init__(self, mark: Callable[[nn.Module, torch.Tensor], None] | None = None) -> None:
        self.memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._quieted: list[nn.Module] = []
        self.mark = mark

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


class MetaBuild:
    """Sends parameters and persistent buffers to `meta` as a module registers them, in the
    building thread only.

    torch's own registration hooks do it (no torch function is replaced); they act only in a
    context (thread) that is building, so a module constructed in another thread at the same
    moment is built as usual. The parameters of the standard torch layers
    (`_INITIALISES_PARAMETERS_ONLY`) are made on meta at once instead
    (`reference.place.host_memory.factories_on_meta`, through the thread-local torch function
    mode the construction guard uses): their host allocation and the swap to meta took a fifth
    of the meta build of a 14B Wan DiT (measured: 50 ms, 41 ms without them). Everything else
    that construction computes (non-persistent buffers: frequency tables, wavelet filters,
    index ranges) keeps its real values (VAE-9). This is accelerate's
    `init_empty_weights(include_buffers=False)`, which diffusers' own low-memory load uses (so
    every diffusers class builds under it), with persistent buffers on meta too: the
    checkpoint fills them. One tensor registered under two names stays one tensor (ties are
    kept for VAE-6).
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

    @classmethod
    def _marked(cls, module: nn.Module, tensor: torch.Tensor) -> torch.Tensor:
        build = cls.active.get()
        if build is not None and build.mark is not None and tensor.is_meta:
            build.mark(module, tensor)
        return tensor

    @staticmethod
    def _swap_to_meta(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        release(tensor)  # its real bytes are about to go
        meta = torch.Tensor._make_subclass(
            type(tensor), tensor.detach().to("meta"), tensor.requires_grad
        )
        # In place: the caller's object itself goes to meta, so attributes it sets on that
        # object after registering it (a layer's `weight_loader`) are kept.
        if (
            SWAP_IMPL is not None
            and tensor._use_count() == 1  # type: ignore[attr-defined]
            and not tensor.is_inference()
        ):
            # Nothing else holds its data (no view, no autograd node): swapping the two
            # objects' data alone is what swap_tensors ends with, without its checks for the
            # cases just ruled out, and the real bytes go with `meta` at once.
            SWAP_IMPL(tensor, meta)
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
        return cls._marked(module, cls.to_meta(param))

    @classmethod
    def on_buffer(cls, module: nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # torch's buffer hook is not told whether the buffer is persistent; the registering
        # call's own argument is. Where that call is not torch's register_buffer (another torch
        # version), the buffer stays real here and `settle` sends it to meta if persistent.
        caller = sys._getframe(1)
        if caller.f_code is not _REGISTER_BUFFER or not caller.f_locals.get("persistent", True):
            return tensor
        return cls._marked(module, cls.to_meta(tensor))

    @classmethod
    @contextmanager
    def building(
        cls,
        mark: Callable[[nn.Module, torch.Tensor], None] | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> Iterator[None]:
        """A meta build in this block (this thread). `mark`: see `_Build`; `dtype`: the
        precision the slots are given next (`factories_on_meta`)."""
        with cls.lock:
            if cls.users == 0:
                cls.hooks = (
                    register_module_parameter_registration_hook(cls.on_parameter),  # type: ignore[arg-type]
                    register_module_buffer_registration_hook(cls.on_buffer),  # type: ignore[arg-type]
                )
            cls.users += 1
        build = _Build(mark)
        token = cls.active.set(build)
        try:
            with factories_on_meta(_LAYER_CONSTRUCTORS, dtype=dtype):
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
            # The stores themselves, not `walk`'s entries: nearly every slot is on meta already,
            # and this runs once per build over every slot.
            for _, sub in submodules(module):
                for attr, param in sub._parameters.items():
                    if param is not None and not param.is_meta:
                        sub._parameters[attr] = cls.to_meta(param)  # type: ignore[assignment]
                skipped = sub._non_persistent_buffers_set
                for attr, buf in sub._buffers.items():
                    if buf is not None and not buf.is_meta and attr not in skipped:
                        sub._buffers[attr] = cls.to_meta(buf)
