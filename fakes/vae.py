"""A tiny video VAE that loads under the standard state-dict ABI, and one violator per rule.

`StandardVAE` has what real video VAEs carry: Conv3d encoder and decoder blocks, group norm, a
batch norm (torch's versioned `_load_from_state_dict`), a weight-norm parametrization (torch's
compatibility load hook), a persistent buffer, a frozen parameter, a float8 parameter, and a
temporal modulation whose frequency table it computes at call time. It has no buffer computed in
`__init__`: what a loader does with those is VAE-9's alone, so VAE-9's own fixtures carry them
(SPEC, "One defect, its rules only"). `prepare_decode_dtype(dtype)` holds the decoder's weights
in bf16 or fp16.

Each violator is a `StandardVAE` with exactly one thing changed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

__all__ = [
    "ABI_FUNCTIONS",
    "HOOK_KINDS",
    "BufferedTemporalModulation",
    "CodebookState",
    "CustomLoadVAE",
    "Decoder",
    "Encoder",
    "ExplicitBufferVAE",
    "ExplicitDeviceTemporalModulation",
    "ExtraEntryVAE",
    "ExtraStateVAE",
    "FollowingTemporalModulation",
    "HalfDecoderVAE",
    "HandleKeepingVAE",
    "HookedBufferVAE",
    "IntegerParameterVAE",
    "LateParamsTemporalModulation",
    "LateParamsVAE",
    "LazyBufferVAE",
    "LazyVAE",
    "LegacyBatchNorm3d",
    "LegacyKeysConv3d",
    "OverriddenBatchNormVAE",
    "PatchedInstanceVAE",
    "PlainBufferVAE",
    "RebuildingFollowingTemporalModulation",
    "RebuildingTemporalModulation",
    "RebuiltBufferVAE",
    "RecordingBuild",
    "ResBlock3d",
    "ScaledGroupNorm",
    "SharedModuleVAE",
    "StandardVAE",
    "StateDictOverrideVAE",
    "TemporalModulation",
    "TiedBeforeRegistrationVAE",
    "TiedBufferVAE",
    "TiedVAE",
    "UnrebuiltBufferVAE",
    "UserHookVAE",
    "VAEConfig",
    "ValueReadingVAE",
    "frequency_table",
    "overriding_base",
    "randomized_state",
    "rename_keys_hook",
    "split_state",
    "user_state_dict_hook",
    "with_inherited_override",
    "with_user_hook",
]


@dataclass(frozen=True)
class VAEConfig:
    """Sizes of the fake; inputs are (batch, in_channels, frames, height, width)."""

    in_channels: int = 3
    hidden: int = 8
    latent_channels: int = 4
    frames: int = 4
    groups: int = 4


def frequency_table(channels: int, frames: int, device: torch.device | None = None) -> torch.Tensor:
    """(frames, channels) rotary-style angles, as video VAEs compute them in `__init__`."""
    inv = 1.0 / (10000.0 ** (torch.arange(channels, device=device, dtype=torch.float32) / channels))
    return torch.outer(torch.arange(frames, device=device, dtype=torch.float32), inv)


class ResBlock3d(nn.Module):
    def __init__(self, channels: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv1 = nn.Conv3d(channels, channels, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv3d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        out: torch.Tensor = x + self.conv2(F.silu(self.norm2(h)))
        return out


class TemporalModulation(nn.Module):
    """Scales each frame by a cosine of a frequency table, computed when called: no state."""

    def __init__(self, channels: int, frames: int) -> None:
        super().__init__()
        self.channels, self.frames = channels, frames

    def table(self, x: torch.Tensor) -> torch.Tensor:
        return frequency_table(self.channels, self.frames, torch.device("cpu")).to(x.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        table = self.table(x)[: x.shape[2]].to(x.dtype)
        return x * (1 + 0.1 * torch.cos(table)).t()[None, :, :, None, None]


class BufferedTemporalModulation(TemporalModulation):
    """The same, its table computed in `__init__` as a non-persistent buffer (VAE-9)."""

    def __init__(self, channels: int, frames: int) -> None:
        super().__init__(channels, frames)
        self.register_buffer("freqs", frequency_table(channels, frames), persistent=False)

    def table(self, x: torch.Tensor) -> torch.Tensor:
        return self.get_buffer("freqs")


class RebuildingTemporalModulation(BufferedTemporalModulation):
    """The same, with the hook that recomputes the table after a meta build."""

    def rebuild_buffers(self, device: torch.device) -> None:
        # Computed on CPU, as construction does, so values match an ordinary build bit for bit.
        self.freqs = frequency_table(self.channels, self.frames, torch.device("cpu")).to(device)


class Encoder(nn.Module):
    def __init__(self, c: VAEConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv3d(c.in_channels, c.hidden, 3, padding=1)
        self.norm = nn.BatchNorm3d(c.hidden)
        self.block = ResBlock3d(c.hidden, c.groups)
        self.conv_out = nn.Conv3d(c.hidden, 2 * c.latent_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.norm(self.conv_in(x)))
        out: torch.Tensor = self.conv_out(self.block(h))
        return out


class Decoder(nn.Module):
    def __init__(self, c: VAEConfig) -> None:
        super().__init__()
        self.conv_in = nn.Conv3d(c.latent_channels, c.hidden, 3, padding=1)
        self.block = ResBlock3d(c.hidden, c.groups)
        self.temporal: TemporalModulation = TemporalModulation(c.hidden, c.frames)
        self.channel_mix = weight_norm(nn.Linear(c.hidden, c.hidden))
        # float8 with the default requires_grad=True: a loader must not keep that flag (VAE-10).
        self.fp8_bias = nn.Parameter(torch.zeros(c.hidden, dtype=torch.float8_e4m3fn))
        self.conv_out = nn.Conv3d(c.hidden, c.in_channels, 3, padding=1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.temporal(self.block(self.conv_in(z)))
        h = self.channel_mix(h.movedim(1, -1)).movedim(-1, 1)
        h = h + self.fp8_bias.to(h.dtype)[None, :, None, None, None]
        out: torch.Tensor = self.conv_out(F.silu(h))
        return out


class StandardVAE(nn.Module):
    """encode: video -> latent mean; decode: latent -> video; forward = decode(encode(x))."""

    latent_scale: torch.Tensor

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__()
        c = config or VAEConfig()
        self.config = c
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)
        self.register_buffer("latent_scale", torch.ones(c.latent_channels))
        self.latent_shift = nn.Parameter(torch.zeros(c.latent_channels), requires_grad=False)
        self.decode_dtype = torch.float32

    def _latent(self, t: torch.Tensor) -> torch.Tensor:
        return t[None, :, None, None, None]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        mean: torch.Tensor = self.encoder(x).chunk(2, dim=1)[0]
        return (mean - self._latent(self.latent_shift)) * self._latent(self.latent_scale)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        z = z * self._latent(self.latent_scale) + self._latent(self.latent_shift)
        out: torch.Tensor = self.decoder(z.to(self.decode_dtype))
        return out.float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))

    def prepare_decode_dtype(self, dtype: torch.dtype) -> None:
        """Hold the decoder's float32 weights in `dtype` (bf16 or fp16); float8 stays float8."""
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"decode dtype must be bfloat16 or float16, got {dtype}")
        for param in self.decoder.parameters():
            if param.dtype == torch.float32:
                param.data = param.data.to(dtype)
        self.decode_dtype = dtype


# --- one violator per rule --------------------------------------------------------------------


class StateDictOverrideVAE(StandardVAE):
    """VAE-2: the root overrides `state_dict`."""

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return super().state_dict(*args, **kwargs)


class PatchedInstanceVAE(StandardVAE):
    """VAE-2: the root instance carries its own `load_state_dict`."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.load_state_dict = self._load  # type: ignore[method-assign,assignment]

    def _load(self, state: Any, strict: bool = True) -> Any:
        return nn.Module.load_state_dict(self, state, strict)


class LegacyKeysConv3d(nn.Conv3d):
    """Renames legacy keys on load: code that direct streaming would skip."""

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        if prefix + "kernel" in state_dict:
            state_dict[prefix + "weight"] = state_dict.pop(prefix + "kernel")
        super()._load_from_state_dict(state_dict, prefix, *args)


class CustomLoadVAE(StandardVAE):
    """VAE-3: a submodule overrides `_load_from_state_dict`."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.conv_in = LegacyKeysConv3d(c.latent_channels, c.hidden, 3, padding=1)


class LegacyBatchNorm3d(nn.BatchNorm3d):
    """A user subclass of a torch layer whose own override counts as standard."""

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args)


class OverriddenBatchNormVAE(StandardVAE):
    """VAE-3: a user override of batch norm's (torch-shipped) `_load_from_state_dict`."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.encoder.norm = LegacyBatchNorm3d(self.config.hidden)


class ScaledGroupNorm(nn.GroupNorm):
    """Saves an extra entry beside its parameters."""

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "scale_inv"] = torch.ones(1)


class ExtraEntryVAE(StandardVAE):
    """VAE-3: a submodule's `_save_to_state_dict` adds an entry."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.block.norm2 = ScaledGroupNorm(c.groups, c.hidden)


def rename_keys_hook(module: nn.Module, state: Any, prefix: str, metadata: Any) -> None:
    """A user state-dict post-hook (renames the keys it finds)."""
    for key in [k for k in state if k.startswith(prefix + "legacy_")]:
        state[key.replace("legacy_", "")] = state.pop(key)


class UserHookVAE(StandardVAE):
    """VAE-3: user code registers a state-dict hook on a submodule."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.conv_out.register_state_dict_post_hook(rename_keys_hook)  # type: ignore[no-untyped-call]


class CodebookState(nn.Module):
    """Stateless, but saves extra state through `get_extra_state`."""

    def get_extra_state(self) -> Any:
        return torch.arange(4)

    def set_extra_state(self, state: Any) -> None:
        pass


class ExtraStateVAE(StandardVAE):
    """VAE-5: the state-dict keys include one that is not a slot (`_extra_state`)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.codebook = CodebookState()


class LateParamsTemporalModulation(TemporalModulation):
    def rebuild_buffers(self, device: torch.device) -> None:
        self.register_parameter("gain", nn.Parameter(torch.ones(self.channels, device=device)))


class LateParamsVAE(StandardVAE):
    """VAE-5: the reference's post-load hook (`rebuild_buffers`) registers a parameter."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.temporal = LateParamsTemporalModulation(c.hidden, c.frames)


class TiedVAE(StandardVAE):
    """VAE-6: two parameters tied (one tensor under two names)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.block.conv1.weight = self.encoder.block.conv1.weight


class SharedModuleVAE(StandardVAE):
    """VAE-6: one submodule registered under two paths."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.block.norm1 = self.encoder.block.norm1


class PlainBufferVAE(StandardVAE):
    """VAE-9: a frequency table computed in `__init__` and no hook to rebuild it, like every
    diffusers class with such buffers. A build with `meta` as the default device leaves it on
    meta; a loader must build it real (only parameters and persistent buffers on meta)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.temporal = BufferedTemporalModulation(c.hidden, c.frames)


class HookedBufferVAE(StandardVAE):
    """VAE-9: the table computed in `__init__`, with the reference's `rebuild_buffers(device)`
    hook beside it (which recomputes it after a meta build)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.temporal = RebuildingTemporalModulation(c.hidden, c.frames)


class FollowingTemporalModulation(BufferedTemporalModulation):
    """Computes its table on a given device: its owner passes the device of one of its own
    parameters, as code that follows the module's device does. Under a meta build that device
    is `meta`, so the table is on meta however the build treats buffers."""

    def __init__(self, channels: int, frames: int, device: torch.device) -> None:
        nn.Module.__init__(self)
        self.channels, self.frames = channels, frames
        self.register_buffer("freqs", frequency_table(channels, frames, device), persistent=False)


class RebuildingFollowingTemporalModulation(FollowingTemporalModulation):
    """The same, with the hook that recomputes the table after a meta build."""

    def rebuild_buffers(self, device: torch.device) -> None:
        self.freqs = frequency_table(self.channels, self.frames, torch.device("cpu")).to(device)


class UnrebuiltBufferVAE(StandardVAE):
    """VAE-9: a non-persistent buffer that a meta build leaves on meta (it follows a
    parameter's device) and that nothing rebuilds: only an ordinary build can load it."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        device = self.decoder.conv_in.weight.device
        self.decoder.temporal = FollowingTemporalModulation(c.hidden, c.frames, device)


class RebuiltBufferVAE(StandardVAE):
    """VAE-9: the buffer of `UnrebuiltBufferVAE` (on meta after a meta build), with the hook
    that rebuilds it after the stream."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        device = self.decoder.conv_in.weight.device
        self.decoder.temporal = RebuildingFollowingTemporalModulation(c.hidden, c.frames, device)


class ExplicitDeviceTemporalModulation(BufferedTemporalModulation):
    def __init__(self, channels: int, frames: int) -> None:
        super().__init__(channels, frames)
        # An explicit device wins over the default device, so a meta build keeps this buffer real.
        self.freqs = frequency_table(channels, frames, torch.device("cpu"))


class ExplicitBufferVAE(StandardVAE):
    """VAE-9 (standard): construction keeps the buffer real by naming its device."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.decoder.temporal = ExplicitDeviceTemporalModulation(c.hidden, c.frames)


class HandleKeepingVAE(StandardVAE):
    """ADM-6: construction keeps its `latent_shift` parameter object in a list, outside the
    module's registries, and `decode` reads it there (as code that caches a handle on a weight
    does). `load_state_dict` into an ordinary build fills that very object, so the handle sees
    the checkpoint; a load that puts new tensors in the slots (a meta build filled by
    `load_state_dict(assign=True)`) leaves the handle on what construction made."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.handles = [self.latent_shift]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        z = z * self._latent(self.latent_scale) + self._latent(self.handles[0])
        out: torch.Tensor = self.decoder(z.to(self.decode_dtype))
        return out.float()


class ValueReadingVAE(StandardVAE):
    """ADM-6: construction reads the value of a parameter it just made (the norm of the
    latent shift's initial weights, kept as a float), as code that logs or normalises its
    initial weights does. An ordinary build runs; a build on meta cannot (a meta tensor has no
    value to read)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.initial_shift_norm = float(self.latent_shift.detach().norm())


class TiedBufferVAE(StandardVAE):
    """VAE-6: one persistent buffer registered under two names."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.register_buffer("latent_scale", self.latent_scale)


class TiedBeforeRegistrationVAE(StandardVAE):
    """VAE-6: one parameter object created first, then registered under two names (a build
    that sends parameters to meta one registration at a time must keep them one tensor)."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        shared = nn.Parameter(torch.ones(self.config.hidden))
        self.encoder.block.norm2.weight = shared
        self.decoder.block.norm2.weight = shared


class IntegerParameterVAE(StandardVAE):
    """VAE-10: an integer parameter (a codebook index table), frozen as torch requires."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        codes = torch.arange(self.config.hidden, dtype=torch.int32)
        self.decoder.codes = nn.Parameter(codes, requires_grad=False)


class HalfDecoderVAE(StandardVAE):
    """Its decoder is built in float16 (float8 stays float8): slots of a 2-byte dtype, so a
    bfloat16 file (same element size, other meaning) must be converted, not reinterpreted."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        for param in self.decoder.parameters():
            if param.dtype == torch.float32:
                param.data = param.data.to(torch.float16)


class LazyVAE(StandardVAE):
    """VAE-4: a lazy layer, whose parameter shapes are settled by its first forward."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.conv_in = nn.LazyConv3d(self.config.hidden, 3, padding=1)


class LazyBufferVAE(StandardVAE):
    """VAE-4b: a lazy persistent buffer (`decoder.scale`), whose shape its first forward would
    settle; the checkpoint may well hold a `decoder.scale` of the right size."""

    def __init__(self, config: VAEConfig | None = None) -> None:
        super().__init__(config)
        self.decoder.register_buffer("scale", nn.parameter.UninitializedBuffer())


# --- every kind of user state-dict hook, and every override inherited from a user class -------


def user_state_dict_hook() -> Callable[..., None]:
    """A fresh user hook of any kind (torch refuses one function registered through both its
    public and its private API); what it does does not matter, that it would be skipped does."""

    def user_state_dict_hook(*args: Any, **kwargs: Any) -> None:
        pass

    return user_state_dict_hook


HOOK_KINDS: dict[str, dict[str, Any]] = {
    "register_state_dict_pre_hook": {},
    "_register_state_dict_hook": {},
    "register_state_dict_post_hook": {},
    "register_load_state_dict_pre_hook": {},
    "_register_load_state_dict_pre_hook": {"with_module": True},
    "register_load_state_dict_post_hook": {},
}
"""Each method user code registers a state-dict or load-state-dict hook with, and its
keyword arguments."""


def with_user_hook(kind: str, path: str) -> type[StandardVAE]:
    """A `StandardVAE` whose submodule at `path` ("" for the root) gets a user hook of `kind`
    (a key of HOOK_KINDS) in `__init__`."""

    class HookedVAE(StandardVAE):
        def __init__(self, config: VAEConfig | None = None) -> None:
            super().__init__(config)
            register: Any = getattr(self.get_submodule(path), kind)
            register(user_state_dict_hook(), **HOOK_KINDS[kind])

    HookedVAE.__qualname__ = HookedVAE.__name__ = f"HookedVAE_{kind}_{path or 'root'}"
    return HookedVAE


ABI_FUNCTIONS = ("state_dict", "_save_to_state_dict", "_load_from_state_dict", "load_state_dict")


def overriding_base(function: str, module_name: str = __name__) -> type[nn.Module]:
    """A user base class (an `nn.Module`) that overrides `function`, calling torch's own: code
    that direct streaming would skip. `module_name` is where the class and the override claim
    to live (a third-party package whose name starts like torch's)."""

    def override(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        return getattr(super(base, self), function)(*args, **kwargs)

    base = type(f"UserBase_{function}", (nn.Module,), {function: override})
    override.__module__ = base.__module__ = module_name
    override.__qualname__ = f"{base.__qualname__}.{function}"
    return base


def with_inherited_override(
    function: str, path: str, module_name: str = __name__
) -> type[StandardVAE]:
    """A `StandardVAE` whose module at `path` ("" for the root) inherits an override of
    `function` from a user base class (see `overriding_base`), not from its own class."""
    base = overriding_base(function, module_name)
    if not path:
        root = type(f"InheritsVAE_{function}", (StandardVAE, base), {})
        root.__module__ = __name__
        return root

    class InheritsVAE(StandardVAE):
        def __init__(self, config: VAEConfig | None = None) -> None:
            super().__init__(config)
            parent, _, name = path.rpartition(".")
            old = self.get_submodule(path)
            # The same layer, but its class also inherits the user base: same state, same values.
            old.__class__ = type(type(old).__name__, (type(old), base), {})
            setattr(self.get_submodule(parent), name, old)

    InheritsVAE.__qualname__ = InheritsVAE.__name__ = f"InheritsVAE_{function}_{path}"
    return InheritsVAE


def randomized_state(model: nn.Module, seed: int) -> OrderedDict[str, torch.Tensor]:
    """A deterministic, non-trivial state dict for `model` (CPU tensors of its dtypes)."""
    g = torch.Generator().manual_seed(seed)
    state: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, tensor in model.state_dict().items():
        if tensor.dtype.is_floating_point:
            values = torch.randn(tensor.shape, generator=g) * 0.3
            if name.endswith(("running_var", "latent_scale")):
                values = values.abs() + 0.5
        else:
            values = torch.randint(0, 7, tensor.shape, generator=g)
        state[name] = values.to(tensor.dtype)
    return state


class RecordingBuild:
    """A build callable for a loader: builds `cls(config)` and records what it built.

    Attributes:
        built: every module built, in order.
        built_on: for each, the device types its state (parameters and persistent buffers) had
            when built.
        buffers_on: for each, the device type of each non-persistent buffer when built.
    """

    def __init__(self, cls: type[StandardVAE] = StandardVAE, config: VAEConfig | None = None):
        self.cls = cls
        self.config = config or VAEConfig()
        self.built: list[nn.Module] = []
        self.built_on: list[set[str]] = []
        self.buffers_on: list[dict[str, str]] = []

    def __call__(self) -> nn.Module:
        module = self.cls(self.config)
        self.built.append(module)
        state, buffers = split_state(module)
        self.built_on.append({t.device.type for t in state.values()})
        self.buffers_on.append({name: t.device.type for name, t in buffers.items()})
        return module

    def assert_untouched(self) -> None:
        """Every module built still holds its slots on meta: a refusal came before any was
        filled (a loader that builds on meta and fills before refusing fails here)."""
        filled = sorted(
            name for m in self.built for name, t in split_state(m)[0].items() if not t.is_meta
        )
        assert not filled, (
            f"the refusal came after the module was filled: {len(filled)} slots hold data"
            f" ({', '.join(filled[:3])}{', ...' if len(filled) > 3 else ''})"
        )


def split_state(module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(parameters and persistent buffers, non-persistent buffers) of `module`, by name, read
    from its registries (no state-dict code of the module runs)."""
    state: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    buffers: dict[str, torch.Tensor] = {}
    for path, sub in module.named_modules(remove_duplicate=False):
        for attr, buf in sub._buffers.items():
            if buf is not None:
                key = f"{path}.{attr}" if path else attr
                target = buffers if attr in sub._non_persistent_buffers_set else state
                target[key] = buf
    return state, buffers
