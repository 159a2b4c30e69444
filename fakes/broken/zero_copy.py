"""Broken zero-copy predicates (ZC-1..8, DG-5): each one misses exactly one condition.

A defective predicate asks the reference's own predicate a question with the missed condition
made true (a parameter without the flag, an owner whose TP size reads 1, ...), so every other
condition is still checked exactly as the reference checks it. The loader uses its predicate for
real: `load_full_state` and `load_dit` adopt what it says to adopt.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from types import MappingProxyType, MethodType

import torch
from torch import nn

from fakes.broken.base import DIRECT_MODE, BrokenAdapter, clone_parameter
from reference.kit.seam import PlanLike
from reference.load.dit import DiTSteps
from reference.place.adopt import (
    ADOPT,
    SPECIAL_FLAGS,
    AdoptSteps,
    LinearKinds,
    Verdict,
    same_device,
)
from reference.place.adopt import zero_copy_verdict as reference_verdict

__all__ = [
    "AcceptsOverridingSubclasses",
    "AdoptsOffCpuTensors",
    "AdoptsParameterSubclasses",
    "AdoptsTensorParallelShards",
    "AdoptsTransposedViews",
    "CopiesInDirectMode",
    "CopiesPlainParameters",
    "IgnoresQuantMethod",
    "IgnoresShardedWeightFlag",
    "PredicateDefect",
    "Question",
    "TrustsUnboundLoaders",
    "fits",
    "reference",
]


@dataclass(frozen=True)
class Question:
    """One zero-copy question, as the reference's predicate takes it."""

    param: torch.Tensor
    tensor: torch.Tensor
    target: torch.Tensor
    kinds: LinearKinds
    direct_device: torch.device | None

    @property
    def loader(self) -> MethodType | None:
        """The parameter's weight_loader when it is a bound method."""
        loader = self.param.__dict__.get("weight_loader")
        return loader if isinstance(loader, MethodType) else None

    def same(self) -> bool:
        """Shape, dtype and layout equal (strides aside)."""
        t, target = self.tensor, self.target
        return (t.shape, t.dtype, t.layout) == (target.shape, target.dtype, target.layout)


def reference(q: Question, **changes: object) -> Verdict:
    """The reference predicate's answer to `q`, with `changes` made to the question first."""
    q = dataclasses.replace(q, **changes)  # type: ignore[arg-type]
    return reference_verdict(
        q.param, q.tensor, q.target, kinds=q.kinds, direct_device=q.direct_device
    )


class PredicateDefect(BrokenAdapter):
    """A loader whose zero-copy predicate is `verdict`, in the predicate and in its loads."""

    also_fails = MappingProxyType({"DG-5": DIRECT_MODE})

    def ask(self, q: Question) -> Verdict:
        """The defect: how this loader answers one zero-copy question."""
        raise NotImplementedError

    def verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        return self.ask(Question(param, checkpoint_tensor, target, kinds, direct_device))

    def zero_copy_verdict(
        self,
        param: torch.Tensor,
        checkpoint_tensor: torch.Tensor,
        target: torch.Tensor,
        *,
        kinds: LinearKinds,
        direct_device: torch.device | None = None,
    ) -> Verdict:
        return self.verdict(
            param, checkpoint_tensor, target, kinds=kinds, direct_device=direct_device
        )

    def dit_steps(self, plan: PlanLike, *, fsdp: bool) -> DiTSteps:
        return DiTSteps(adopt=AdoptSteps(verdict=self.verdict))


class AdoptsOffCpuTensors(PredicateDefect):
    """Adopts checkpoint tensors wherever they are, not only on CPU (ZC-1)."""

    name = "broken-adopts-off-cpu"
    breaks = frozenset({"ZC-1"})
    also_fails = MappingProxyType({})
    gpu_only = "a checkpoint tensor off the CPU needs a CUDA tensor beside the CPU"

    def ask(self, q: Question) -> Verdict:
        if q.direct_device is None and q.tensor.device.type != "cpu":
            return reference(q, direct_device=q.tensor.device)  # "wherever it is" is fine
        return reference(q)


class CopiesPlainParameters(PredicateDefect):
    """Copies every parameter that has no `weight_loader` (plain torch layers: every diffusers
    model) even when its tensor fits, as if ZC-2 refused it (ZC-2b)."""

    name = "broken-copies-plain-parameters"
    breaks = frozenset({"ZC-2b"})
    also_fails = MappingProxyType({})  # plain parameters are ZC-2b's in direct mode too

    def ask(self, q: Question) -> Verdict:
        verdict = reference(q)
        if verdict.adopt and "weight_loader" not in q.param.__dict__:
            return Verdict(False, "ZC-2: the parameter has no weight_loader")
        return verdict


def fits(q: Question) -> bool:
    """ZC-6..8 alone: a plain parameter, no special flag, same shape, dtype, layout, strides."""
    return (
        type(q.param) is nn.Parameter
        and not any(q.param.__dict__.get(flag, False) for flag in SPECIAL_FLAGS)
        and q.same()
        and q.tensor.layout == torch.strided
        and q.tensor.stride() == q.target.stride()
    )


class TrustsUnboundLoaders(PredicateDefect):
    """Trusts a weight_loader that is a plain function or a lambda: having no owner to ask
    about, it checks only ZC-6..8 (ZC-2)."""

    name = "broken-trusts-unbound-loaders"
    breaks = frozenset({"ZC-2"})
    also_fails = MappingProxyType(
        {"DG-5": DIRECT_MODE + "; a direct load adopts the DiT's pos_embed"}
    )

    def ask(self, q: Question) -> Verdict:
        loader = q.param.__dict__.get("weight_loader")
        if callable(loader) and q.loader is None and fits(q):
            where = q.tensor.device
            if same_device(where, q.direct_device or torch.device("cpu")):
                return ADOPT
        return reference(q)


class AcceptsOverridingSubclasses(PredicateDefect):
    """Accepts any subclass of a standard linear, even one that overrides `weight_loader`
    (a merged QKV layer): it checks the owner's class, not the function (ZC-3)."""

    name = "broken-accepts-overriding-subclasses"
    breaks = frozenset({"ZC-3"})
    also_fails = MappingProxyType(
        {
            "DG-5": DIRECT_MODE + "; a direct load adopts the merged QKV layer",
        }
    )

    def ask(self, q: Question) -> Verdict:
        loader = q.loader
        if loader is not None and isinstance(loader.__self__, q.kinds.layers):
            owner = loader.__self__
            base = next(layer for layer in q.kinds.layers if isinstance(owner, layer))
            standard = MethodType(base.weight_loader, owner)  # type: ignore[attr-defined]
            return reference(q, param=clone_parameter(q.param, weight_loader=standard))
        return reference(q)


class IgnoresQuantMethod(PredicateDefect):
    """Adopts tensors of layers whatever their quant method (ZC-4)."""

    name = "broken-ignores-quant-method"
    breaks = frozenset({"ZC-4"})
    also_fails = MappingProxyType({"DG-5": DIRECT_MODE})

    def ask(self, q: Question) -> Verdict:
        return reference(q, kinds=dataclasses.replace(q.kinds, unquantized_method=object))


class AdoptsTensorParallelShards(PredicateDefect):
    """Adopts tensors of a TP=2 layer: it never reads the owner's tp_size (ZC-5)."""

    name = "broken-adopts-tp-shards"
    breaks = frozenset({"ZC-5"})
    also_fails = MappingProxyType(
        {
            "DG-5": DIRECT_MODE,
            "ZC-10": "the TP slice test pins ZC-5 and ZC-10 together (a row-parallel bias is"
            " adopted)",
        }
    )

    def ask(self, q: Question) -> Verdict:
        loader = q.loader
        if loader is None or not hasattr(loader.__self__, "tp_size"):
            return reference(q)
        twin = copy.copy(loader.__self__)  # the same layer, with tp_size reading 1
        twin.tp_size = 1
        return reference(
            q, param=clone_parameter(q.param, weight_loader=MethodType(loader.__func__, twin))
        )


class AdoptsParameterSubclasses(PredicateDefect):
    """Adopts into parameter subclasses as if they were plain parameters (ZC-6)."""

    name = "broken-adopts-parameter-subclasses"
    breaks = frozenset({"ZC-6", "ZC-2c"})  # the one predicate judges plain parameters too

    def ask(self, q: Question) -> Verdict:
        return reference(q, param=clone_parameter(q.param, cls=nn.Parameter))


class IgnoresShardedWeightFlag(PredicateDefect):
    """Checks `is_metadata` and `needs_scalar_to_array`, but not `is_sharded_weight` (ZC-7)."""

    name = "broken-ignores-is-sharded-weight"
    breaks = frozenset({"ZC-7", "ZC-2c"})  # the one predicate judges plain parameters too

    def ask(self, q: Question) -> Verdict:
        return reference(q, param=clone_parameter(q.param, drop=("is_sharded_weight",)))


class AdoptsTransposedViews(PredicateDefect):
    """Compares shape, dtype and layout but not strides, so it adopts a transposed
    (non-contiguous) view (ZC-8)."""

    name = "broken-adopts-transposed-views"
    breaks = frozenset({"ZC-8", "ZC-2c"})  # the one predicate judges plain parameters too

    def ask(self, q: Question) -> Verdict:
        if q.same() and q.tensor.layout == torch.strided:
            t = q.tensor  # asked as if it had the target's strides
            return reference(
                q,
                tensor=torch.empty_strided(
                    t.shape, q.target.stride(), dtype=t.dtype, device=t.device
                ),
            )
        return reference(q)


class CopiesInDirectMode(PredicateDefect):
    """In direct mode, copies every tensor on the device instead of adopting it, so the whole
    state dict sits beside the model (DG-5)."""

    name = "broken-copies-in-direct-mode"
    # A plain parameter takes its tensor as is in any mode (ZC-2b), direct mode included.
    breaks = frozenset({"DG-5", "ZC-2b"})
    also_fails = MappingProxyType({})

    def ask(self, q: Question) -> Verdict:
        verdict = reference(q)
        if q.direct_device is not None and verdict.adopt:
            return Verdict(False, f"DG-5: direct mode copies every tensor on {q.direct_device}")
        return verdict
