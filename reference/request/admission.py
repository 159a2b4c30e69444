"""Admission of direct-GPU loading requests: one table of rules, three gates (ADM, DG-2/3/6/7).

A request is one component asked for direct-GPU loading by one flag: the global DiT flag asks for
every transformer component the pipeline declares (DG-7); a per-component flag asks for that
component. Three gates consult the same table, `ADMISSION_RULES`, each with the facts it has:

  pipeline   (model_index.json known)  every selected component is declared (ADM-1)
  arguments  (platform known)          CUDA, residency, no FSDP, tp_size 1 (DG-2, ADM-2)
  loader     (the loader's declaration) the loader supports the request (ADM-3)

A rule listed for several gates answers with the same predicate at each, so the gates cannot
drift apart (ADM-4): the quantized-checkpoint refusal (DG-3) is one rule consulted by all three.
A gate refuses with the first rule (in table order) that any request fails, and its message
names every request that fails it: the flag, the component and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from reference.errors import (
    ArgumentError,
    ComponentCheckpointUnsupportedError,
    LoadError,
)
from reference.request.args import (
    COMPONENT_DIRECT_FLAG,
    DEVICE_FLAG,
    DIRECT_FLAG,
    FSDP_FLAG,
    LAYERWISE_FLAG,
    TP_FLAG,
    ServerArgs,
    component_flag,
    normalise_component,
)
from reference.request.model_index import (
    Pipeline,
    encoder_index,
    is_text_encoder_component,
    is_transformer_component,
)
from reference.request.platform import Platform
from reference.request.precision import (
    COMPONENT_PRECISIONS_FLAG,
    TEXT_ENCODER_PRECISIONS_FLAG,
    precision_name,
)
from reference.request.quantization import QuantizationSpec

__all__ = [
    "ADMISSION_RULES",
    "ARGUMENTS",
    "CCUE",
    "LOADER",
    "NO_DIRECT_SUPPORT",
    "PIPELINE",
    "AdmissionRule",
    "Check",
    "DirectRequest",
    "DirectSupport",
    "Facts",
    "Gate",
    "admit",
    "check_arguments",
    "check_loader",
    "check_pipeline",
    "direct_requests",
    "rules_for",
]

Gate = Literal["pipeline", "arguments", "loader"]
PIPELINE: Gate = "pipeline"
ARGUMENTS: Gate = "arguments"
LOADER: Gate = "loader"


@dataclass(frozen=True)
class DirectRequest:
    """One component asked for direct-GPU loading.

    Attributes:
        component: the normalised component name.
        flag: the option that asked, as a user writes it.
    """

    component: str
    flag: str

    @property
    def by_dit_flag(self) -> bool:
        return self.flag == DIRECT_FLAG


@dataclass(frozen=True)
class DirectSupport:
    """What direct-GPU loading a loader supports (declared per loader class, ADM-3).

    Attributes:
        dit_flag: transformer components, when asked by the global DiT flag.
        components: components it loads directly when asked by the per-component flag.
    """

    dit_flag: bool = False
    components: frozenset[str] = frozenset()

    def covers(self, request: DirectRequest) -> bool:
        """Whether the loader can honour `request` exactly."""
        if request.by_dit_flag:
            return self.dit_flag and is_transformer_component(request.component)
        return request.component in self.components

    def describe(self) -> str:
        """What it supports, in words (for messages)."""
        parts = []
        if self.dit_flag:
            parts.append(f"transformer components via {DIRECT_FLAG}")
        if self.components:
            parts.append(f"{COMPONENT_DIRECT_FLAG}.<{'|'.join(sorted(self.components))}>")
        return " and ".join(parts) or "no direct-GPU loading"


NO_DIRECT_SUPPORT = DirectSupport()


@dataclass(frozen=True)
class Facts:
    """What a gate knows. A rule only runs at gates that hold the facts it reads.

    Attributes:
        args: the loading options (every gate).
        declared: components model_index.json declares (pipeline gate).
        platform: the machine (arguments gate).
        loader: the loader's name and declared support (loader gate).
        checkpoint_quantization: quantization declared by a component's own config.json.
    """

    args: ServerArgs
    declared: tuple[str, ...] = ()
    platform: Platform | None = None
    loader: tuple[str, DirectSupport] | None = None
    checkpoint_quantization: Mapping[str, QuantizationSpec] = field(default_factory=dict)


Check = Callable[[DirectRequest, Facts], "str | None"]


@dataclass(frozen=True)
class AdmissionRule:
    """One row of the table.

    Attributes:
        name: short name of the rule.
        contract: the contract rule IDs it implements.
        gates: the gates that consult it.
        error: the error type it raises.
        check: returns None to admit a request, or the problem (flag, component, fix).
    """

    name: str
    contract: tuple[str, ...]
    gates: frozenset[Gate]
    error: type[LoadError]
    check: Check


def _declared(request: DirectRequest, facts: Facts) -> str | None:
    if request.component in facts.declared:
        return None
    declared = ", ".join(facts.declared) or "none"
    if request.by_dit_flag:
        return (
            f"{DIRECT_FLAG} asks for the transformer components, but model_index.json declares"
            f" none (declared: {declared}); drop {DIRECT_FLAG}"
        )
    return (
        f"{request.flag} selects component {request.component!r}, which model_index.json does"
        f" not declare (declared: {declared}); correct the name or drop the flag"
    )


def _loader_supports(request: DirectRequest, facts: Facts) -> str | None:
    assert facts.loader is not None
    name, support = facts.loader
    if support.covers(request):
        return None
    hint = f"drop {request.flag}"
    if is_transformer_component(request.component) and not request.by_dit_flag:
        hint = f"use {DIRECT_FLAG} for transformer components"
    return (
        f"{request.flag}: the {name} loader cannot load component {request.component!r} directly"
        f" onto the GPU (it supports {support.describe()}); {hint}"
    )


def _unquantized(request: DirectRequest, facts: Facts) -> str | None:
    declared = facts.checkpoint_quantization.get(request.component)
    if declared is not None:
        source = f"its config.json declares quantization {declared.method!r}"
    elif is_transformer_component(request.component) and facts.args.quantization is not None:
        source = f"it is quantized with --quantization {facts.args.quantization.method}"
    else:
        return None
    return (
        f"{request.flag}: component {request.component!r} is quantized ({source}); direct-GPU"
        f" loading supports only unquantized checkpoints; drop {request.flag} or load an"
        " unquantized checkpoint"
    )


def _cuda(request: DirectRequest, facts: Facts) -> str | None:
    assert facts.platform is not None
    device = facts.args.device
    if not facts.platform.cuda_available():
        return (
            f"{request.flag}: direct-GPU loading of component {request.component!r} needs CUDA,"
            f" and the platform reports none; run on a CUDA machine or drop {request.flag}"
        )
    if device.type != "cuda":
        return (
            f"{request.flag}: direct-GPU loading of component {request.component!r} needs a CUDA"
            f" runtime device, got {device}; set {DEVICE_FLAG} cuda or drop {request.flag}"
        )
    return None


def _resident(request: DirectRequest, facts: Facts) -> str | None:
    args, name = facts.args, request.component
    if args.is_cpu_offloaded(name):
        cause = args.cpu_offload_flag(name)
    elif args.is_layerwise_offloaded(name):
        cause = LAYERWISE_FLAG
    else:
        return None
    return (
        f"{request.flag}: component {name!r} is offloaded ({cause}), and direct-GPU loading needs"
        f" it resident on the runtime device; drop {cause} or drop {request.flag}"
    )


def _no_fsdp(request: DirectRequest, facts: Facts) -> str | None:
    if not (facts.args.fsdp_inference and is_transformer_component(request.component)):
        return None
    return (
        f"{request.flag}: component {request.component!r} is sharded by {FSDP_FLAG}, and direct-GPU"
        f" loading needs the whole component on one device; drop {FSDP_FLAG} or {request.flag}"
    )


def _tp_one(request: DirectRequest, facts: Facts) -> str | None:
    tp = facts.args.tp_size
    if tp == 1 or not is_transformer_component(request.component):
        return None
    return (
        f"{request.flag}: component {request.component!r} runs with {TP_FLAG} {tp}, and direct-GPU"
        f" loading needs {TP_FLAG} 1; set {TP_FLAG} 1 or drop {request.flag}"
    )


_ALL: frozenset[Gate] = frozenset({PIPELINE, ARGUMENTS, LOADER})
CCUE = ComponentCheckpointUnsupportedError

ADMISSION_RULES: tuple[AdmissionRule, ...] = (
    AdmissionRule("declared", ("ADM-1", "DG-7"), frozenset({PIPELINE}), CCUE, _declared),
    AdmissionRule("loader-support", ("ADM-3",), frozenset({LOADER}), CCUE, _loader_supports),
    AdmissionRule("unquantized", ("DG-3",), _ALL, CCUE, _unquantized),
    AdmissionRule("cuda", ("DG-2", "ADM-2"), frozenset({ARGUMENTS}), ArgumentError, _cuda),
    AdmissionRule(
        "resident", ("DG-2", "ADM-2", "DG-7"), frozenset({ARGUMENTS}), ArgumentError, _resident
    ),
    AdmissionRule("no-fsdp", ("DG-2",), frozenset({ARGUMENTS}), ArgumentError, _no_fsdp),
    AdmissionRule("tp-size-1", ("DG-2",), frozenset({ARGUMENTS}), ArgumentError, _tp_one),
)
"""The one table every gate consults, in the order refusals are reported."""


def rules_for(gate: Gate) -> tuple[AdmissionRule, ...]:
    """The rows of ADMISSION_RULES that `gate` consults, in table order."""
    return tuple(rule for rule in ADMISSION_RULES if gate in rule.gates)


def direct_requests(args: ServerArgs, declared: Iterable[str]) -> tuple[DirectRequest, ...]:
    """Every direct-GPU request `args` makes of a pipeline declaring `declared`.

    The DiT flag asks for every declared transformer component (DG-7), or for `transformer`
    when none is declared (so the pipeline gate can refuse it). Per-component flags set to true
    ask for their component.
    """
    requests: list[DirectRequest] = []
    if args.direct_gpu_weight_loading:
        dits = [name for name in declared if is_transformer_component(name)] or ["transformer"]
        requests.extend(DirectRequest(name, DIRECT_FLAG) for name in dits)
    for name, selected in args.component_direct_gpu_weight_loading.items():
        if selected:
            requests.append(DirectRequest(name, component_flag(COMPONENT_DIRECT_FLAG, name)))
    return tuple(requests)


def _consult(gate: Gate, requests: Sequence[DirectRequest], facts: Facts) -> None:
    for rule in rules_for(gate):
        problems = [p for r in requests if (p := rule.check(r, facts)) is not None]
        if problems:
            raise rule.error("; ".join(dict.fromkeys(problems)))


def check_pipeline(
    args: ServerArgs,
    *,
    declared: Sequence[str],
    checkpoint_quantization: Mapping[str, QuantizationSpec] | None = None,
) -> tuple[DirectRequest, ...]:
    """Pipeline gate (ADM-1): every selected component is declared in model_index.json.

    Returns:
        The requests `args` makes of this pipeline.

    Raises:
        ComponentCheckpointUnsupportedError: listing every undeclared selection, or a quantized
            selection (DG-3).
        ArgumentError: a precision override for an undeclared component (PREC-3).
    """
    refuse_undeclared_precisions(args, declared)
    requests = direct_requests(args, declared)
    facts = Facts(args, tuple(declared), checkpoint_quantization=checkpoint_quantization or {})
    _consult(PIPELINE, requests, facts)
    return requests


def refuse_undeclared_precisions(args: ServerArgs, declared: Sequence[str]) -> None:
    """PREC-3: a precision override names a component the pipeline declares, as a direct-loading
    selection must (ADM-1); an override that would apply to nothing is a mistake, not a no-op.

    Raises:
        ArgumentError: listing every undeclared override and the declared components.
    """
    refuse_text_encoder_precision_count(args, declared)
    known = {normalise_component(name) for name in declared}
    unknown = sorted(name for name in args.component_precisions if name not in known)
    if unknown:
        flags = ", ".join(component_flag(COMPONENT_PRECISIONS_FLAG, name) for name in unknown)
        raise ArgumentError(
            f"{flags}: the pipeline declares no such component (model_index.json declares"
            f" {', '.join(sorted(known)) or 'none'}); name a declared component or drop the flag"
        )


def refuse_text_encoder_precision_count(args: ServerArgs, declared: Sequence[str]) -> None:
    """TE-3: `--text-encoder-precisions` gives one value for every text encoder, or one per text
    encoder the pipeline declares; another count is refused, naming both counts.

    Raises:
        ArgumentError: naming the flag, the values given and the text encoders declared.
    """
    values = args.text_encoder_precisions
    encoders = sorted(
        (normalise_component(n) for n in declared if is_text_encoder_component(n)),
        key=encoder_index,
    )
    if len(values) in (0, 1, len(encoders)):
        return
    given = " ".join(precision_name(v) for v in values)
    raise ArgumentError(
        f"{TEXT_ENCODER_PRECISIONS_FLAG} {given}: {len(values)} values for"
        f" {len(encoders)} text encoder(s) ({', '.join(encoders) or 'none declared'}); give one"
        " value for all of them, or one per text encoder in that order"
    )


def check_arguments(
    args: ServerArgs, *, platform: Platform, declared: Sequence[str] = ("transformer",)
) -> tuple[DirectRequest, ...]:
    """Arguments gate (DG-2, ADM-2, DG-7): CUDA, residency of every selected component, no FSDP
    and tp_size 1 for DiT components.

    Args:
        args: the loading options.
        platform: the machine (a fake in tests).
        declared: the pipeline's components (the DiT flag covers its transformer components).

    Returns:
        The requests admitted.

    Raises:
        ArgumentError: naming the flag, the component and the fix.
        ComponentCheckpointUnsupportedError: for a DiT quantized by --quantization (DG-3).
    """
    args = args.on_platform(platform)
    requests = direct_requests(args, declared)
    _consult(ARGUMENTS, requests, Facts(args, tuple(declared), platform=platform))
    return requests


def check_loader(
    support: DirectSupport,
    component: str,
    args: ServerArgs,
    *,
    loader: str,
    checkpoint_quantization: QuantizationSpec | None = None,
) -> bool:
    """Loader gate (ADM-3): whether to load `component` directly, refusing what `loader` cannot do.

    Runs on facts alone: it opens no file and changes nothing, so a loader can call it first.

    Returns:
        True when direct-GPU loading of `component` was asked for (and is supported).

    Raises:
        ComponentCheckpointUnsupportedError: the no-fallback error (ADM-5).
    """
    requests = [r for r in direct_requests(args, (component,)) if r.component == component]
    quantized = {} if checkpoint_quantization is None else {component: checkpoint_quantization}
    facts = Facts(args, (component,), loader=(loader, support), checkpoint_quantization=quantized)
    _consult(LOADER, requests, facts)
    return bool(requests)


def admit(pipeline: Pipeline, args: ServerArgs, *, platform: Platform) -> tuple[DirectRequest, ...]:
    """The pipeline gate, then the arguments gate, for one run.

    Returns:
        The admitted direct-GPU requests (empty when no flag is set).

    Raises:
        ComponentCheckpointUnsupportedError: from the pipeline gate (ADM-1, DG-3).
        ArgumentError: from the arguments gate (DG-2, ADM-2, DG-7).
    """
    quantized = {
        name: spec.quantization
        for name, spec in pipeline.components.items()
        if spec.quantization is not None
    }
    check_pipeline(args, declared=pipeline.names, checkpoint_quantization=quantized)
    return check_arguments(args, platform=platform, declared=pipeline.names)
