"""What every broken loader shares: the reference adapter, one defect, and the rules it breaks.

A broken loader is a real loader: the reference adapter with exactly one behaviour changed. Where
that behaviour lives inside the reference (a step of `load_dit` or `load_vae`, the zero-copy
predicate), the loader passes its own step through the reference's explicit seam
(`reference.load.dit.DiTSteps`, `reference.load.vae.VAESteps`), so everything else runs the
reference's code unchanged and nothing global is patched.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

import torch

from reference.kit.adapters.reference import ReferenceAdapter

__all__ = ["DIRECT_MODE", "BrokenAdapter", "clone_parameter"]

# Why rules other than the broken one fail too: tests that pin several rules at once.
DIRECT_MODE = "the direct-mode cases of the zero-copy truth table pin DG-5 (ZC-2..8 on the device)"


class BrokenAdapter(ReferenceAdapter):
    """The reference adapter with one defect.

    Class attributes:
        name: the adapter's name in reports (`broken-...`).
        breaks: the rules the defect violates; the suite must fail each of them.
        also_fails: other rules whose tests fail too, each with the reason (a test that pins
            the broken rule together with this one); nothing else may fail.
        gpu_only: why only a real device shows the defect (the CPU tier hands a loader no
            device but the CPU, SPEC "Real inputs"), or None: the CPU tier's self-tests skip
            a loader with a reason, and count its rules as broken all the same.
    """

    name = "broken"
    breaks: ClassVar[frozenset[str]] = frozenset()
    also_fails: ClassVar[Mapping[str, str]] = MappingProxyType({})
    gpu_only: ClassVar[str | None] = None

    @classmethod
    def expected_failures(cls) -> frozenset[str]:
        """Every rule a run of the suite against this loader reports as failed."""
        return cls.breaks | frozenset(cls.also_fails)


def clone_parameter(
    param: torch.Tensor,
    *,
    cls: type[torch.Tensor] | None = None,
    drop: tuple[str, ...] = (),
    **attributes: object,
) -> torch.Tensor:
    """A parameter over the same data and attributes, of class `cls`, without `drop`, with
    `attributes` added: the question a defective check asks instead of the real one."""
    new = torch.Tensor._make_subclass(cls or type(param), param.detach(), param.requires_grad)
    new.__dict__.update({k: v for k, v in param.__dict__.items() if k not in drop})
    new.__dict__.update(attributes)
    return new
