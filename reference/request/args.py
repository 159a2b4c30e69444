"""Server arguments: the loading options as one frozen value, and their command line (ARGS, DG-1).

Every loading flag is declared once, in `FLAGS` (what `python -m reference load --help` lists);
the parser is built from it. argparse conventions hold, and every flag also accepts underscores
for its dashes. A boolean flag alone means true; its value is given as `=VALUE` or as the next
token when that token is not an option, and must be `true` or `false` in any case. Component
names normalise `-` to `_`. Everything else passes through untouched and in order, as does
everything after `--`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NoReturn, Protocol, runtime_checkable

import torch

from reference.errors import ArgumentError
from reference.request.model_index import (
    encoder_index,
    is_image_encoder_component,
    is_text_encoder_component,
    is_transformer_component,
)
from reference.request.platform import Platform, default_runtime_device
from reference.request.precision import (
    COMPONENT_PRECISIONS_FLAG,
    DEFAULT_DIT_PRECISION,
    DEFAULT_VAE_PRECISION,
    DIT_PRECISION_FLAG,
    IMAGE_ENCODER_PRECISION_FLAG,
    TEXT_ENCODER_PRECISIONS_FLAG,
    VAE_PRECISION_FLAG,
    check_precision,
    parse_precision,
)
from reference.request.quantization import QuantizationSpec

__all__ = [
    "FLAGS",
    "Flag",
    "Parser",
    "ServerArgs",
    "ServerArgsLike",
    "known_flags",
    "own_server_args",
    "parse_args",
    "parse_bool",
]

DIRECT_FLAG = "--direct-gpu-weight-loading"
COMPONENT_DIRECT_FLAG = "--component-direct-gpu-weight-loading"
COMPONENT_OFFLOAD_FLAG = "--component-cpu-offload"
DIT_OFFLOAD_FLAG = "--dit-cpu-offload"
LAYERWISE_FLAG = "--dit-layerwise-offload"
FSDP_FLAG = "--fsdp-inference"
TP_FLAG = "--tp-size"
QUANTIZATION_FLAG = "--quantization"
DEVICE_FLAG = "--device"

SERIALIZED_FLAG = "--quantization-serialized"
PROG = "python -m reference load"
FlagKind = Literal[
    "device", "bool", "component", "count", "method", "precision", "precision_list", "precisions"
]
_METAVARS: Mapping[FlagKind, str] = MappingProxyType(
    {
        "device": " DEVICE",
        "bool": " [true|false]",
        "component": ".COMPONENT[=true|false]",
        "count": " N",
        "method": " METHOD",
        "precision": " fp32|fp16|bf16",
        "precision_list": " P [P ...]",
        "precisions": ".COMPONENT=fp32|fp16|bf16",
    }
)


@dataclass(frozen=True)
class Flag:
    """One loading flag: its name, how its value is written, what it does.

    Attributes:
        name: as users write it (dashes; underscores are accepted too).
        kind: its value: a device, true/false, a per-component `.COMPONENT[=true|false]`, a
            count, or a method name.
        help: one line for `load --help`.
        field: the ServerArgs field a per-component flag fills (None for the others).
    """

    name: str
    kind: FlagKind
    help: str
    field: str | None = None

    @property
    def usage(self) -> str:
        return self.name + _METAVARS[self.kind]


FLAGS: tuple[Flag, ...] = (
    Flag(
        DEVICE_FLAG,
        "device",
        "runtime device: cpu, cuda or cuda:N (default: cuda:0 if present, else cpu)",
    ),
    Flag(DIT_OFFLOAD_FLAG, "bool", "CPU-offload every DiT component (zero-copy adoption)"),
    Flag(LAYERWISE_FLAG, "bool", "layerwise offload of the DiT"),
    Flag(
        COMPONENT_OFFLOAD_FLAG,
        "component",
        "CPU-offload one component (vae, text_encoder, ...)",
        field="component_cpu_offload",
    ),
    Flag(DIRECT_FLAG, "bool", "load every DiT component straight onto the GPU (CUDA only)"),
    Flag(
        COMPONENT_DIRECT_FLAG,
        "component",
        "load one component straight onto the GPU: vae, video_vae (CUDA only)",
        field="component_direct_gpu_weight_loading",
    ),
    Flag(FSDP_FLAG, "bool", "FSDP inference (the DiT is sharded by FSDP)"),
    Flag(TP_FLAG, "count", "tensor-parallel size (default 1)"),
    Flag(DIT_PRECISION_FLAG, "precision", "dtype of every DiT component (default bf16)"),
    Flag(VAE_PRECISION_FLAG, "precision", "dtype of the VAEs and the vocoder (default fp32)"),
    Flag(
        TEXT_ENCODER_PRECISIONS_FLAG,
        "precision_list",
        "dtype of the text encoders: one for all, or one per text encoder (default: stored)",
    ),
    Flag(
        IMAGE_ENCODER_PRECISION_FLAG,
        "precision",
        "dtype of the image encoder (default: the dtype its checkpoint stores)",
    ),
    Flag(
        COMPONENT_PRECISIONS_FLAG,
        "precisions",
        "dtype of one component, over the flags above (transformer_2, vae, text_encoder, ...)",
        field="component_precisions",
    ),
    Flag(QUANTIZATION_FLAG, "method", "quantize the DiT online, e.g. fp8 (classes built for it)"),
    Flag(SERIALIZED_FLAG, "bool", "the checkpoint is already stored in that format"),
)
"""Every loading flag, once: the parser below and `load --help` are built from it."""

# Per-component flags: `<prefix>.<component>`, and the ServerArgs field each one fills.
COMPONENT_FLAGS = {flag.name: flag.field for flag in FLAGS if flag.field is not None}
_FLAG_OF_FIELD = {value: key for key, value in COMPONENT_FLAGS.items()}
# The per-component flags whose value is a precision (the others are true/false).
_PRECISION_FIELDS = frozenset({"component_precisions"})
_BOOL_WORDS = {"true": True, "false": False}


def normalise_component(name: str) -> str:
    """A component name as the contract compares it: `-` becomes `_` (`video-vae`: `video_vae`)."""
    return name.replace("-", "_")


def component_flag(prefix: str, component: str) -> str:
    """How a user writes a per-component flag: `--component-cpu-offload.vae`."""
    return f"{prefix}.{component}"


def _component_map(field_name: str, raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """ARGS-4: non-empty names, real bools (real precisions for `component_precisions`,
    PREC-3), one value per normalised name."""
    flag = _FLAG_OF_FIELD[field_name]
    what = "a precision" if field_name in _PRECISION_FIELDS else "True/False"
    if not isinstance(raw, Mapping):
        raise ArgumentError(
            f"{field_name} must map component names to {what}, got {type(raw).__name__}"
        )
    values: dict[str, Any] = {}
    spellings: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not normalise_component(name).strip("_ "):
            raise ArgumentError(
                f"{field_name}: component name {name!r} is empty; name a component, as in"
                f" {component_flag(flag, 'vae')}"
            )
        key = normalise_component(name)
        if field_name in _PRECISION_FIELDS:
            check_precision(f"{field_name}[{name!r}]", value)
        elif type(value) is not bool:
            raise ArgumentError(
                f"{field_name}[{name!r}] must be True or False, got {type(value).__name__}"
                f" {value!r}; pass a real bool ({component_flag(flag, key)}=true on the command"
                " line)"
            )
        if key in values and values[key] != value:
            raise ArgumentError(
                f"{field_name}: {spellings[key]!r}={values[key]} and {name!r}={value} name the"
                f" same component {key!r} with different values; keep one"
            )
        values[key] = value
        spellings[key] = name
    return MappingProxyType(values)


def _require_bool(name: str, value: object) -> None:
    if type(value) is not bool:
        raise ArgumentError(
            f"{name} must be True or False, got {type(value).__name__} {value!r}; pass a real bool"
        )


@dataclass(frozen=True, kw_only=True)
class ServerArgs:
    """The loading options of one run. Construction validates and normalises (ARGS-4).

    Attributes:
        runtime_device: where components compute; None (the default) lets the platform decide
            when a load starts: cuda:0 when it reports CUDA, else cpu (`on_platform`).
        dit_cpu_offload: DiT components start on CPU.
        dit_layerwise_offload: DiT components stream their layers from CPU.
        component_cpu_offload: per-component CPU offload (normalised name -> bool); an entry
            overrides dit_cpu_offload for that component.
        fsdp_inference: the DiT is sharded with FSDP.
        tp_size: tensor-parallel size of the DiT.
        quantization: how the DiT is quantized, or None.
        direct_gpu_weight_loading: direct-GPU loading of every DiT component (DG-1, DG-7).
        component_direct_gpu_weight_loading: per-component direct-GPU loading (ARGS-1).
        dit_precision: the dtype of every DiT component (PREC-1; default bfloat16).
        vae_precision: the dtype of the VAEs and the vocoder (PREC-1; default float32).
        text_encoder_precisions: the dtype of the text encoders (TE-3): one value for every
            text encoder, or one per text encoder in the order `text_encoder`,
            `text_encoder_2`, ...; empty (the default) keeps the dtype each checkpoint stores.
        image_encoder_precision: the dtype of the image encoders (TE-3); None keeps the stored
            dtype.
        component_precisions: per-component dtype (normalised name -> dtype), over the
            precisions above.

    Raises:
        ArgumentError: for an empty component name, a value that is not a real bool (`"true"`
            and `1` are refused), two spellings of one component with different values, a
            tp_size below 1, or a precision that is not float32, float16 or bfloat16.
    """

    runtime_device: torch.device | None = None
    dit_cpu_offload: bool = False
    dit_layerwise_offload: bool = False
    component_cpu_offload: Mapping[str, bool] = field(default_factory=dict)
    fsdp_inference: bool = False
    tp_size: int = 1
    quantization: QuantizationSpec | None = None
    direct_gpu_weight_loading: bool = False
    component_direct_gpu_weight_loading: Mapping[str, bool] = field(default_factory=dict)
    dit_precision: torch.dtype = DEFAULT_DIT_PRECISION
    vae_precision: torch.dtype = DEFAULT_VAE_PRECISION
    text_encoder_precisions: Sequence[torch.dtype] = ()
    image_encoder_precision: torch.dtype | None = None
    component_precisions: Mapping[str, torch.dtype] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.runtime_device is not None and not isinstance(self.runtime_device, torch.device):
            raise ArgumentError(
                f"runtime_device must be a torch.device, got {self.runtime_device!r};"
                f" write torch.device({str(self.runtime_device)!r})"
            )
        for name in ("dit_cpu_offload", "dit_layerwise_offload", "fsdp_inference"):
            _require_bool(name, getattr(self, name))
        _require_bool("direct_gpu_weight_loading", self.direct_gpu_weight_loading)
        if type(self.tp_size) is not int or self.tp_size < 1:
            raise ArgumentError(f"tp_size must be an integer >= 1, got {self.tp_size!r}")
        if self.quantization is not None and not isinstance(self.quantization, QuantizationSpec):
            raise ArgumentError(
                f"quantization must be a QuantizationSpec or None, got {self.quantization!r}"
            )
        check_precision("dit_precision", self.dit_precision)
        check_precision("vae_precision", self.vae_precision)
        if isinstance(self.text_encoder_precisions, (str, bytes)) or not isinstance(
            self.text_encoder_precisions, Sequence
        ):
            raise ArgumentError(
                "text_encoder_precisions must be a sequence of dtypes, got"
                f" {self.text_encoder_precisions!r}"
            )
        for i, value in enumerate(self.text_encoder_precisions):
            check_precision(f"text_encoder_precisions[{i}]", value)
        object.__setattr__(self, "text_encoder_precisions", tuple(self.text_encoder_precisions))
        if self.image_encoder_precision is not None:
            check_precision("image_encoder_precision", self.image_encoder_precision)
        for name in COMPONENT_FLAGS.values():
            object.__setattr__(self, name, _component_map(name, getattr(self, name)))

    def on_platform(self, platform: Platform) -> ServerArgs:
        """These options with the runtime device settled: as given, else the platform's default
        (cuda:0 when it reports CUDA, else cpu). Every load settles its options first."""
        if self.runtime_device is not None:
            return self
        return dataclasses.replace(self, runtime_device=default_runtime_device(platform))

    @property
    def device(self) -> torch.device:
        """The runtime device of options settled by `on_platform`.

        Raises:
            ArgumentError: the options were not settled (a caller skipped `on_platform`).
        """
        if self.runtime_device is None:
            raise ArgumentError(
                "runtime_device is not settled; call on_platform(platform) first, or pass"
                " runtime_device=torch.device(...)"
            )
        return self.runtime_device

    def should_direct_gpu_weight_load_component(self, name: str) -> bool:
        """ARGS-5: whether component `name` was opted in by its exact normalised name.

        False by default. The global DiT flag is not consulted here; admission combines both.
        """
        return self.component_direct_gpu_weight_loading.get(normalise_component(name), False)

    def is_cpu_offloaded(self, name: str) -> bool:
        """Whether component `name` starts on CPU: its own entry, else dit_cpu_offload for DiTs."""
        key = normalise_component(name)
        if key in self.component_cpu_offload:
            return self.component_cpu_offload[key]
        return self.dit_cpu_offload and is_transformer_component(key)

    def cpu_offload_flag(self, name: str) -> str:
        """The option that makes component `name` CPU-offloaded (for messages)."""
        key = normalise_component(name)
        if key in self.component_cpu_offload:
            return (
                f"{component_flag(COMPONENT_OFFLOAD_FLAG, key)}={self.component_cpu_offload[key]}"
            )
        return DIT_OFFLOAD_FLAG

    def precision_for(self, name: str) -> torch.dtype:
        """PREC-1: the dtype component `name` is built in: its own entry of
        `component_precisions`, else `dit_precision` for a DiT component, else `vae_precision`
        (the VAEs and the vocoder). Encoders and components of no named kind default to their
        checkpoint's dtype instead: `precision_or_stored`."""
        key = normalise_component(name)
        if key in self.component_precisions:
            return self.component_precisions[key]
        return self.dit_precision if is_transformer_component(key) else self.vae_precision

    def precision_or_stored(self, name: str, *, stored: torch.dtype) -> torch.dtype:
        """The dtype a component whose loader defaults to its checkpoint's dtype is built in (a
        text or image encoder, TE-3; a component of no named kind: LTX-2's `connectors`, a
        UNet): its own entry of `component_precisions`, else `--image-encoder-precision` for
        an image encoder, else `--text-encoder-precisions` for a text encoder (its one value,
        or the value at the encoder's position), else the vocoder's for a `vocoder` (one of
        the transformers library loads through the encoder loader; PREC-1 gives every vocoder
        `vae_precision`), else `stored`, the dtype its checkpoint stores (a default load
        converts nothing). The count of `text_encoder_precisions` is checked at admission,
        where the pipeline's text encoders are known."""
        key = normalise_component(name)
        if key in self.component_precisions:
            return self.component_precisions[key]
        if is_image_encoder_component(key) and self.image_encoder_precision is not None:
            return self.image_encoder_precision
        values = self.text_encoder_precisions
        if is_text_encoder_component(key) and values:
            return (
                values[0] if len(values) == 1 else values[min(encoder_index(key), len(values) - 1)]
            )
        if key == "vocoder":
            return self.vae_precision
        return stored

    def is_layerwise_offloaded(self, name: str) -> bool:
        """Whether component `name` streams its layers from CPU (DiT components only)."""
        return self.dit_layerwise_offload and is_transformer_component(normalise_component(name))


@runtime_checkable
class ServerArgsLike(Protocol):
    """What the conformance suite reads from a loader's server arguments."""

    @property
    def direct_gpu_weight_loading(self) -> bool: ...
    @property
    def component_direct_gpu_weight_loading(self) -> Mapping[str, bool]: ...
    def should_direct_gpu_weight_load_component(self, name: str) -> bool: ...


def own_server_args(args: ServerArgsLike) -> ServerArgs:
    """`args` as the reference's ServerArgs.

    Raises:
        ArgumentError: for server arguments built by another loader.
    """
    if not isinstance(args, ServerArgs):
        raise ArgumentError(
            f"expected reference.request.args.ServerArgs, got {type(args).__name__}; build one with"
            " reference.parse_args or ServerArgs(...)"
        )
    return args


# --- command line --------------------------------------------------------------------------------


def parse_bool(flag: str, value: str) -> bool:
    """A flag's boolean value: `true` or `false` in any case.

    Raises:
        ArgumentError: for any other value (empty included), naming the flag and the fix.
    """
    parsed = _BOOL_WORDS.get(value.lower())
    if parsed is None:
        raise ArgumentError(
            f"{flag}: expected true or false (any case), got {value!r}; write {flag}=true or"
            f" {flag}=false (a bare {flag} means true when no plain argument follows it)"
        )
    return parsed


def did_you_mean(token: str, known: Sequence[str]) -> str | None:
    """The known flag nearest to a misspelled `token` (`--dit-cpu-ofload`), or None.

    A per-component flag is matched by its prefix and keeps its component
    (`--component-cpu-ofload.vae` -> `--component-cpu-offload.vae`).
    """
    key = token.split("=", 1)[0]
    prefix, dot, component = key.partition(".")
    candidates = [flag for flag in known if ("." in flag) == bool(dot)]
    match = difflib.get_close_matches(prefix + dot, candidates, n=1, cutoff=0.75)
    if not match:
        return None
    return match[0] + component if dot else match[0]


class Parser(argparse.ArgumentParser):
    """The one parser class of the command line: a usage error raises ArgumentError (one line,
    like every other refusal) instead of printing usage and exiting, and an unknown flag is
    answered with the nearest known one."""

    def error(self, message: str) -> NoReturn:
        _, sep, unknown = message.partition("unrecognized arguments: ")
        if not sep:
            _, sep, tail = message.partition(": ")
            # Our own type errors start with the flag: drop argparse's "argument X: " prefix.
            if sep and tail.startswith("--"):
                raise ArgumentError(tail)
        else:
            known = [*known_flags(), *self._option_string_actions]
            hints = [
                f"{token}: did you mean {near}?"
                for token in unknown.split()
                if token.startswith("--") and (near := did_you_mean(token, known)) is not None
            ]
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        raise ArgumentError(f"{message}; see {self.prog} --help")


def _bool_type(flag: str) -> Any:
    def convert(value: str) -> bool:
        try:
            return parse_bool(flag, value)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _precision_type(flag: str) -> Any:
    def convert(value: str) -> torch.dtype:
        try:
            return parse_precision(flag, value)
        except ArgumentError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _device(value: str) -> torch.device:
    try:
        return torch.device(value)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{DEVICE_FLAG}: {value!r} is not a device; write cuda, cuda:0 or cpu"
        ) from None


def _tp_size(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{TP_FLAG}: expected an integer >= 1, got {value!r}")
    return int(value)


def _parser() -> Parser:
    """The loading flags of `FLAGS` (per-component ones aside: argparse has no `--flag.NAME`
    form, so `extract_component_flags` takes those out first)."""
    parser = Parser(prog=PROG, add_help=False, allow_abbrev=False)
    for flag in FLAGS:
        names = (flag.name, "--" + flag.name[2:].replace("-", "_"))
        if flag.kind == "bool":
            convert = _bool_type(flag.name)
            parser.add_argument(*names, nargs="?", const=True, default=False, type=convert)
        elif flag.kind == "device":
            parser.add_argument(*names, type=_device, default=None)
        elif flag.kind == "count":
            parser.add_argument(*names, type=_tp_size, default=1)
        elif flag.kind == "method":
            parser.add_argument(*names, default=None)
        elif flag.kind == "precision":
            parser.add_argument(*names, type=_precision_type(flag.name), default=None)
        elif flag.kind == "precision_list":
            convert = _precision_type(flag.name)
            parser.add_argument(*names, type=convert, nargs="+", default=None)
    return parser


def known_flags() -> tuple[str, ...]:
    """Every loading flag as users write it (dashes): the parser's options, then each
    per-component prefix followed by its dot (`--component-cpu-offload.`)."""
    options = [o for o in _parser()._option_string_actions if "_" not in o]
    return (*options, *(f"{prefix}." for prefix in COMPONENT_FLAGS))


def _component_prefix(token: str) -> tuple[str, str] | None:
    """(flag prefix, raw component) when `token` is a per-component flag, else None."""
    if not token.startswith("--"):
        return None
    key = token.split("=", 1)[0]
    head, dot, component = key[2:].partition(".")
    prefix = "--" + head.replace("_", "-")
    if prefix not in COMPONENT_FLAGS:
        return None
    if not dot:
        raise ArgumentError(
            f"{key}: names no component; write {prefix}.<component>, as in"
            f" {component_flag(prefix, 'vae')}"
        )
    return prefix, component


def extract_component_flags(
    argv: Sequence[str],
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """ARGS-1..3: pull the per-component flags out of `argv`.

    Returns:
        ({field name: {normalised component: value}}, the other arguments in order).

    Raises:
        ArgumentError: for an empty component name, a value that is not true/false (an empty
            one included; for a precision flag, one that is not fp32, fp16 or bf16, PREC-3), or
            one component given different values (in any spelling).
    """
    values: dict[str, dict[str, Any]] = {name: {} for name in COMPONENT_FLAGS.values()}
    spelled: dict[tuple[str, str], str] = {}
    remaining: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            remaining.extend(argv[i:])
            break
        found = _component_prefix(token)
        i += 1
        if found is None:
            remaining.append(token)
            continue
        prefix, raw = found
        key, eq, value = token.partition("=")
        component = normalise_component(raw)
        field_name = COMPONENT_FLAGS[prefix]
        precision = field_name in _PRECISION_FIELDS
        if not component.strip("_"):
            example = "bf16" if precision else "true"
            raise ArgumentError(
                f"{key}: the component name is empty; write {component_flag(prefix, '<component>')}"
                f", as in {component_flag(prefix, 'vae')}={example}"
            )
        if not eq:
            value = "" if precision else "true"  # a precision has no implicit value
            if i < len(argv) and not argv[i].startswith("-"):
                value = argv[i]
                i += 1
        parsed: object = parse_precision(key, value) if precision else parse_bool(key, value)
        target = values[field_name]
        if component in target and target[component] != parsed:
            raise ArgumentError(
                f"{spelled[prefix, component]} and {key}={value} give component {component!r}"
                " different values; keep one of them"
            )
        target[component] = parsed
        spelled[prefix, component] = f"{key}={value}"
    return values, remaining


def parse_args(argv: Sequence[str]) -> tuple[ServerArgs, list[str]]:
    """Parse the loading options out of a command line.

    Args:
        argv: arguments without the program name.

    Returns:
        (the ServerArgs, the arguments that are not loading options, untouched and in order).

    Raises:
        ArgumentError: for a malformed option, naming the flag and the fix (DG-1, ARGS-2).
    """
    components, rest = extract_component_flags(argv)
    namespace, remaining = _parser().parse_known_args(rest)
    quantization = None
    if namespace.quantization is not None:
        if not namespace.quantization:
            raise ArgumentError(f"{QUANTIZATION_FLAG}: empty method; write {QUANTIZATION_FLAG} fp8")
        quantization = QuantizationSpec(
            namespace.quantization, serialized=namespace.quantization_serialized
        )
    elif namespace.quantization_serialized:
        raise ArgumentError(
            f"{SERIALIZED_FLAG} needs {QUANTIZATION_FLAG} METHOD; add it or drop the flag"
        )
    args = ServerArgs(
        runtime_device=namespace.device,
        dit_cpu_offload=namespace.dit_cpu_offload,
        dit_layerwise_offload=namespace.dit_layerwise_offload,
        component_cpu_offload=components["component_cpu_offload"],
        fsdp_inference=namespace.fsdp_inference,
        tp_size=namespace.tp_size,
        quantization=quantization,
        direct_gpu_weight_loading=namespace.direct_gpu_weight_loading,
        component_direct_gpu_weight_loading=components["component_direct_gpu_weight_loading"],
        dit_precision=namespace.dit_precision or DEFAULT_DIT_PRECISION,
        vae_precision=namespace.vae_precision or DEFAULT_VAE_PRECISION,
        text_encoder_precisions=tuple(namespace.text_encoder_precisions or ()),
        image_encoder_precision=namespace.image_encoder_precision,
        component_precisions=components["component_precisions"],
    )
    return args, remaining
