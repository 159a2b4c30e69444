"""The rule catalogue: every rule of the loading contract, with its ID, level and origin.

This table is the single source: the test plugin validates `@pytest.mark.rule(...)` IDs against it,
the conformance report lists every rule in it, and `python -m reference rules` prints it.
`upstream` rules restate what the upstream diffusion loader does; `beyond` rules close a gap it
leaves open. MUST rules of a declared capability admit no escape; SHOULD rules are advice a
loader may knowingly decline (declared as expectations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BEYOND",
    "BY_ID",
    "MUST",
    "RULES",
    "SHOULD",
    "UPSTREAM",
    "Level",
    "Origin",
    "Rule",
    "get",
]

Level = Literal["MUST", "SHOULD"]
Origin = Literal["upstream", "beyond"]


@dataclass(frozen=True)
class Rule:
    """One rule of the contract."""

    id: str
    level: Level
    origin: Origin
    title: str

    @property
    def section(self) -> str:
        return self.id.split("-", 1)[0]


MUST: Level = "MUST"
SHOULD: Level = "SHOULD"
UPSTREAM: Origin = "upstream"  # the design notes' upstream change pins it
BEYOND: Origin = "beyond"  # the contract adds it beyond upstream

RULES: tuple[Rule, ...] = (
    # PLAN: the weight-load plan
    Rule(
        "PLAN-1",
        MUST,
        UPSTREAM,
        "A plan is a frozen value, fixed per component before any byte is read",
    ),
    Rule(
        "PLAN-2",
        MUST,
        UPSTREAM,
        "for_component derives post-process device and deferral from its inputs",
    ),
    Rule("PLAN-3", MUST, BEYOND, "Self-contradictory plans are refused when constructed"),
    Rule(
        "PLAN-4",
        MUST,
        UPSTREAM,
        "No plan given means the default plan: runtime device, all flags off",
    ),
    # DEV: where the checkpoint lands
    Rule("DEV-1", MUST, UPSTREAM, "Offloaded unquantized components load their checkpoint on CPU"),
    Rule(
        "DEV-2",
        MUST,
        UPSTREAM,
        "Quantized components stay on the runtime device unless the method loads on CPU",
    ),
    Rule("DEV-3", MUST, UPSTREAM, "All four offload x quantized combinations are pinned"),
    # ZC: zero-copy adoption of CPU checkpoint tensors
    Rule(
        "ZC-1", MUST, UPSTREAM, "With a weight_loader, adoption needs the checkpoint tensor on CPU"
    ),
    Rule("ZC-2", MUST, UPSTREAM, "Adoption needs a bound-method weight_loader on the parameter"),
    Rule(
        "ZC-2b",
        MUST,
        UPSTREAM,
        "Without weight_loader the tensor is taken directly in any mode: adopted or converted",
    ),
    Rule(
        "ZC-2c",
        MUST,
        BEYOND,
        "...adopted only as an exact Parameter, no special flag, same layout and strides",
    ),
    Rule(
        "ZC-3", MUST, UPSTREAM, "Adoption needs a standard linear owner using its own weight loader"
    ),
    Rule(
        "ZC-4", MUST, UPSTREAM, "Adoption needs the owner's quant method to be the unquantized one"
    ),
    Rule(
        "ZC-5",
        MUST,
        UPSTREAM,
        "Adoption needs tp_size == 1 (read at call time) for parallel owners",
    ),
    Rule("ZC-6", MUST, UPSTREAM, "Adoption needs the parameter's type to be exactly nn.Parameter"),
    Rule(
        "ZC-7",
        MUST,
        UPSTREAM,
        "Adoption is refused for is_metadata / is_sharded_weight / needs_scalar_to_array",
    ),
    Rule("ZC-8", MUST, UPSTREAM, "Adoption needs equal shape, dtype, layout and strides"),
    Rule(
        "ZC-9",
        MUST,
        UPSTREAM,
        "An adopted parameter keeps its attributes, has requires_grad False, equals the file",
    ),
    Rule(
        "ZC-10",
        MUST,
        UPSTREAM,
        "Refused tensors are copied by the layer's own weight_loader; its asserts are named",
    ),
    Rule(
        "ZC-11",
        MUST,
        UPSTREAM,
        "Parameters without weight_loader take the tensor as is after conversion",
    ),
    Rule(
        "ZC-12",
        MUST,
        BEYOND,
        "Adopted parameters never alias each other unless the model ties them",
    ),
    Rule(
        "ZC-13", MUST, BEYOND, "Writing to an adopted parameter never changes the checkpoint file"
    ),
    Rule(
        "ZC-14",
        SHOULD,
        BEYOND,
        "The load report counts adopted vs copied and names each refusal's condition",
    ),
    Rule(
        "ZC-15",
        MUST,
        BEYOND,
        "Buffers stay buffers: persistent ones hold the checkpoint, others their constructed value",
    ),
    # PREC: precision, the dtype each component computes in
    Rule(
        "PREC-1",
        MUST,
        UPSTREAM,
        "Each component is built in its precision: a bf16 DiT and an fp32 VAE by default,"
        " exact per-component overrides",
    ),
    Rule(
        "PREC-2",
        MUST,
        BEYOND,
        "Modules the class keeps in fp32 stay fp32; integer and float8 slots keep their dtype",
    ),
    Rule(
        "PREC-3",
        MUST,
        UPSTREAM,
        "Unknown precisions, empty components and overrides for undeclared components are"
        " refused before any read",
    ),
    Rule(
        "PREC-4",
        MUST,
        BEYOND,
        "A tensor in its slot's dtype is adopted; any other is converted once, no intermediate",
    ),
    Rule(
        "PREC-5",
        MUST,
        BEYOND,
        "Direct and streaming modes convert per tensor: peak within the model plus one tensor",
    ),
    Rule(
        "PREC-6",
        SHOULD,
        BEYOND,
        "The load report states each component's precision and its conversions, from -> to",
    ),
    # DG: opt-in direct-GPU loading of the DiT
    Rule(
        "DG-1",
        MUST,
        UPSTREAM,
        "--direct-gpu-weight-loading is off by default; bare/true/false parse; else error",
    ),
    Rule("DG-2", MUST, UPSTREAM, "Direct DiT loading needs CUDA, residency, no FSDP and tp_size 1"),
    Rule(
        "DG-3",
        MUST,
        UPSTREAM,
        "Direct DiT loading of a quantized DiT is refused before any tensor data is read",
    ),
    Rule(
        "DG-3b",
        MUST,
        BEYOND,
        "...at admission, with the no-fallback error, naming the component",
    ),
    Rule(
        "DG-4", MUST, UPSTREAM, "Direct mode loads on the runtime device, skipping the CPU pre-read"
    ),
    Rule(
        "DG-5",
        MUST,
        BEYOND,
        "Direct mode adopts eligible device tensors: peak <= model + largest tensor",
    ),
    Rule("DG-6", SHOULD, BEYOND, "Direct mode checks free device memory before any byte moves"),
    Rule(
        "DG-8",
        MUST,
        BEYOND,
        "Direct mode stages through a bounded host area: host growth <= it + one tensor",
    ),
    Rule(
        "DG-7",
        MUST,
        BEYOND,
        "The DiT flag covers, and checks residency of, every transformer component",
    ),
    # FP8: online quantization and deferred CPU offload
    Rule(
        "FP8-1",
        MUST,
        UPSTREAM,
        "Online fp8/mxfp4 need device weight processing; None and plain serialized do not",
    ),
    Rule(
        "FP8-2",
        MUST,
        UPSTREAM,
        "Offloaded components needing processing: load -> process on device -> offload",
    ),
    Rule(
        "FP8-3",
        MUST,
        UPSTREAM,
        "Online FP8 keeps CPU offload (deferred); serialized ModelOpt FP8 disables it",
    ),
    Rule(
        "FP8-4",
        MUST,
        UPSTREAM,
        "With FSDP the post-process override is dropped with a warning; no deferral",
    ),
    Rule("FP8-5", MUST, UPSTREAM, "A failed quantized load raises; never an unquantized fallback"),
    Rule(
        "FP8-6",
        MUST,
        BEYOND,
        "After deferral every tensor is on CPU with processed values bit-exact",
    ),
    # ARGS: command line and server arguments
    Rule(
        "ARGS-1",
        MUST,
        UPSTREAM,
        "--component-direct-gpu-weight-loading.<name> parses in every documented form",
    ),
    Rule(
        "ARGS-2",
        MUST,
        BEYOND,
        "Bad values, empty names and conflicting spellings are errors naming the flag",
    ),
    Rule("ARGS-3", MUST, UPSTREAM, "Unrelated arguments are left untouched and in order"),
    Rule("ARGS-4", MUST, UPSTREAM, "Programmatic construction validates names and real bools"),
    Rule(
        "ARGS-5",
        MUST,
        UPSTREAM,
        "should_direct_gpu_weight_load_component: exact normalised name, false by default",
    ),
    # ADM: three-layer admission
    Rule(
        "ADM-1",
        MUST,
        UPSTREAM,
        "Pipeline gate: selected components must be declared; all unknown ones listed",
    ),
    Rule("ADM-2", MUST, UPSTREAM, "Arguments gate: a selected component needs CUDA and residency"),
    Rule(
        "ADM-3", MUST, UPSTREAM, "Loader gate: unsupported requests refused first thing in load()"
    ),
    Rule("ADM-4", SHOULD, BEYOND, "One rule table serves all three gates"),
    Rule(
        "ADM-5",
        MUST,
        UPSTREAM,
        "The no-fallback error is a ValueError that no fallback path catches",
    ),
    Rule(
        "ADM-6",
        MUST,
        UPSTREAM,
        "With no flag set every component loads as it would without the feature",
    ),
    # PIPE: a whole pipeline
    Rule(
        "PIPE-1",
        MUST,
        BEYOND,
        "A pipeline load returns every weight-bearing component it declares, or refuses before"
        " any tensor read naming each it cannot load; weightless ones listed with the reason",
    ),
    Rule(
        "PIPE-2",
        MUST,
        BEYOND,
        "Every refusal that needs no tensor data runs for every component before any is read;"
        " one memory preflight per device for all components, naming device, bytes, components",
    ),
    Rule(
        "PIPE-3",
        MUST,
        BEYOND,
        "A pipeline load is atomic: a failed component is named, and nothing of the load stays"
        " alive (modules, memory, reader threads, open files)",
    ),
    Rule(
        "PIPE-4",
        MUST,
        BEYOND,
        "Concurrent loading gives what a sequential load gives, reports in declared order, and"
        " no peak memory above what the preflight counted",
    ),
    # VAE: meta construction and per-tensor streaming
    Rule(
        "VAE-1",
        MUST,
        UPSTREAM,
        "Direct VAE: built on meta, streamed tensor by tensor, no full CPU state dict",
    ),
    Rule(
        "VAE-2",
        MUST,
        UPSTREAM,
        "The state-dict functions must be torch.nn.Module's own (identity check)",
    ),
    Rule(
        "VAE-3",
        MUST,
        BEYOND,
        "The ABI check covers every submodule and user hooks; torch's own count as standard",
    ),
    Rule("VAE-4", MUST, UPSTREAM, "Slots are parameters and persistent buffers only"),
    Rule(
        "VAE-4b",
        MUST,
        BEYOND,
        "A lazy parameter or buffer is refused by name before any data is read",
    ),
    Rule(
        "VAE-5",
        MUST,
        UPSTREAM,
        "State-dict keys must equal the slots; the error lists the difference",
    ),
    Rule("VAE-6", MUST, UPSTREAM, "Tied parameters or buffers are refused, naming them"),
    Rule(
        "VAE-7",
        MUST,
        UPSTREAM,
        "Duplicate, unknown and wrong-shape tensors refused by name; dtype converted",
    ),
    Rule("VAE-8", MUST, UPSTREAM, "Missing slots are refused (listed); nothing is left on meta"),
    Rule(
        "VAE-9",
        MUST,
        BEYOND,
        "Non-persistent buffers are real after a direct load, or the load fails naming them",
    ),
    Rule(
        "VAE-10",
        MUST,
        UPSTREAM,
        "requires_grad as the loader's ordinary path gives it; integer and float8 never",
    ),
    Rule(
        "VAE-11",
        MUST,
        UPSTREAM,
        "channels_last_3d and decode dtype apply to streamed modules as to ordinary ones",
    ),
    Rule(
        "VAE-12",
        MUST,
        UPSTREAM,
        "Quantized VAE checkpoints and custom-code auto_map are refused in direct mode",
    ),
    Rule(
        "VAE-12b",
        MUST,
        BEYOND,
        "...also when the quantization is declared only in the safetensors __metadata__",
    ),
    Rule("VAE-13", MUST, UPSTREAM, "The CPU target branch works as well as the CUDA branch"),
    # TE: text and image encoders (components of the transformers library)
    Rule(
        "TE-1",
        MUST,
        BEYOND,
        "Text and image encoders load through the loader's own paths: the named class built"
        " with no initialisation or host allocation, tensors under the CKPT rules, adopted"
        " under CPU offload; every slot as from_pretrained(torch_dtype=) gives it",
    ),
    Rule(
        "TE-2",
        MUST,
        BEYOND,
        "Tied slots share one storage, filled from whichever tied name the checkpoint holds;"
        " both held: equal adopted once, different refused naming both",
    ),
    Rule(
        "TE-3",
        MUST,
        BEYOND,
        "An encoder's precision defaults to its stored dtype; --text-encoder-precisions,"
        " --image-encoder-precision and --component-precisions.<c> set it; fp32 kept as"
        " from_pretrained keeps it",
    ),
    Rule(
        "TE-4",
        MUST,
        BEYOND,
        "An encoder the loader cannot build (missing class, auto_map, no transformers, an"
        " unimplemented quantization) is refused before any tensor data is read, naming the"
        " component, the class and the fix",
    ),
    # CKPT: checkpoints and bad input
    Rule("CKPT-1", MUST, BEYOND, "Only safetensors is read; nothing from a checkpoint executes"),
    Rule("CKPT-2", MUST, BEYOND, "Sharded checkpoints load; index and shards must agree"),
    Rule(
        "CKPT-3",
        MUST,
        BEYOND,
        "Header names, shapes and dtypes are checked before any tensor data is read",
    ),
    Rule(
        "CKPT-4",
        MUST,
        BEYOND,
        "Corrupt input is a clear error naming file and entry; never a crash or hang",
    ),
    Rule(
        "CKPT-5",
        MUST,
        BEYOND,
        "load() returns a complete component or raises; files are never written",
    ),
    Rule(
        "CKPT-6",
        MUST,
        BEYOND,
        "A load is bounded by its checkpoint: host growth at most 4x its bytes + 1 GiB; a"
        " config that sizes a build past it is refused before the allocation, naming the key",
    ),
    # OUT: what a load returns
    Rule(
        "OUT-1",
        MUST,
        BEYOND,
        "A loaded DiT or VAE is ready for inference on every path: eval mode, nothing on meta",
    ),
)

BY_ID: dict[str, Rule] = {rule.id: rule for rule in RULES}


def get(rule_id: str) -> Rule:
    """Return the rule with this ID.

    Raises:
        KeyError: naming the unknown ID and the known sections.
    """
    try:
        return BY_ID[rule_id]
    except KeyError:
        sections = sorted({rule.section for rule in RULES})
        raise KeyError(
            f"unknown rule {rule_id!r}: IDs look like PLAN-1; sections are {', '.join(sections)}"
        ) from None
